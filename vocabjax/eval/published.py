"""The papers' published figures, copied from the papers (never measured here): the papers'
report (`eval/papers_report.py`) sets them beside a run's, and the TPU projections of
the papers' pairs (`vocabjax.bench.papers`) take their acceptance lengths from them.

Every figure names its source (paper, version, table); a figure that could not be read from
its source is not here.
"""

from __future__ import annotations

# The papers' own headline claims (their abstracts), for the comparison table. Per-group tables
# are in the papers (arXiv HTML) and can be added here with their table numbers.
PUBLISHED = [
    ("FR-Spec (Zhao et al. 2025, arXiv 2502.14856)", "EAGLE-2 drafter, Llama-3-8B (128K vocab), GPU",
     "LM-head computation cut by 75%; average 1.12x speedup over EAGLE-2"),
    ("VocabTrim (Goel et al. 2025, arXiv 2506.22694)", "drafters of Llama-3 models, Spec-Bench",
     "memory-bound speedup +16% for Llama-3.2-3B-Instruct"),
    ("SpecVocab (Williams et al. 2026, arXiv 2602.13836)", "EAGLE-3 drafters, Spec-Bench, GPU",
     "higher acceptance length than EAGLE-3; up to +8.1% average throughput over EAGLE-3"),
]

# The papers' per-group figures, copied from the papers (ratios below are computed from them).
# FR-Spec (arXiv 2502.14856v2, https://arxiv.org/html/2502.14856; ACL 2025): 1x A800, EAGLE-2
# depth 6 / 60 draft tokens, Spec-Bench 80 prompts per task + HumanEval, temperature 0, FR-Spec
# subsets from SlimPajama counts. Its columns, in its order, as our task groups: MT. = WMT14
# translation, Conv. = MT-bench (multi-turn), RAG, Math = GSM8K, QA = Natural Questions,
# Summ. = CNN/DailyMail, Code = HumanEval.
FRSPEC_GROUPS = ("translation", "multi-turn", "rag", "math_reasoning", "qa", "summarization",
                 "humaneval")
FRSPEC_TAU = {  # Table 1 (Llama-3-8B, 128K vocabulary), average acceptance length
    "full": (3.66, 4.12, 4.05, 4.29, 3.49, 3.68, 3.92),
    "64k": (3.59, 4.07, 3.98, 4.26, 3.42, 3.65, 3.62),
    "32k": (3.39, 3.89, 3.85, 4.15, 3.34, 3.51, 3.29),
    "16k": (3.20, 3.63, 3.56, 3.84, 3.19, 3.28, 3.10),
    "8k": (2.98, 3.33, 3.25, 3.52, 2.97, 2.98, 2.86),
}
FRSPEC_TAU_QWEN = {  # Table 6 (Qwen-2-7B, 152K vocabulary: the target family of ours)
    "full": (2.90, 4.06, 3.65, 4.31, 3.27, 3.74, 4.22),
    "32k": (2.83, 3.73, 3.53, 4.20, 3.39, 3.58, 3.71),
}
FRSPEC_TOKS = {  # Table 2 (Llama-3-8B, their C/CUDA implementation), tokens/s
    "full": (176.79, 203.41, 168.05, 209.88, 166.60, 167.12, 175.11),  # EAGLE-2
    "64k": (192.85, 224.52, 178.53, 231.99, 183.17, 183.86, 183.11),
    "32k": (195.60, 227.68, 184.85, 243.36, 190.27, 188.14, 183.19),
    "16k": (194.02, 223.32, 178.22, 233.69, 188.60, 182.26, 176.70),
    "8k": (185.78, 210.66, 167.64, 218.57, 180.40, 170.97, 167.85),
}
FRSPEC_HEAD_SHARE = "49% of EAGLE-2's drafting time (62% with the softmax; Llama-3-8B, Fig. 6)"
# SpecVocab (arXiv 2602.13836): its repository's README (github.com/SamsungLabs/SpecVocab), H100,
# SGLang fork, Spec-Bench batch 1: average throughput gain of SpecVocab (k = 2048) over EAGLE-3
# with its 32,000-token head. Its per-group tables 1-2 were not readable here.
SPECVOCAB_GAIN = {"OLMo 2 1B": 0.050, "OLMo 2 7B": 0.081, "Qwen3 4B": 0.050, "Qwen3 8B": 0.043}
# VocabTrim (arXiv 2506.22694v2), abstract: memory-bound speedup +16% for Llama-3.2-3B-Instruct's
# EAGLE drafter on Spec-Bench (32K target-generated vocabulary); per-task tables not readable here.
VOCABTRIM_MBSU_GAIN = 0.16

# EAGLE-3 (Li et al., arXiv 2503.01840v3, NeurIPS 2025) Table 1, temperature 0, "speedup ratios
# and average acceptance lengths tau" on MT-bench, HumanEval, GSM8K, Alpaca, CNN/DM and their
# mean (read from a text copy of the v3 PDF; a second copy gives the same cells).
EAGLE3_GROUPS = ("mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm")
EAGLE3_TABLE1 = {  # (speedup, tau) per group, then the paper's Mean
    ("llama31_8b", "eagle2"): ((3.16, 4.05), (3.66, 4.71), (3.39, 4.24), (3.28, 4.12),
                               (2.65, 3.45), (3.23, 4.11)),
    ("llama31_8b", "eagle3"): ((4.40, 6.13), (4.85, 6.74), (4.48, 6.23), (4.82, 6.70),
                               (3.65, 5.34), (4.44, 6.23)),
    ("llama33_70b", "eagle2"): ((2.83, 3.67), (3.12, 4.09), (2.83, 3.69), (3.03, 3.92),
                                (2.44, 3.55), (2.85, 3.78)),
    ("llama33_70b", "eagle3"): ((4.11, 5.63), (4.79, 6.52), (4.34, 6.15), (4.30, 6.09),
                                (3.27, 5.02), (4.12, 5.88)),
}
EAGLE3_TAU = {"llama31_8b": EAGLE3_TABLE1[("llama31_8b", "eagle3")][-1][1],
              "source": "EAGLE-3 (arXiv 2503.01840v3) Table 1, LLaMA-Instruct 3.1 8B, EAGLE-3, "
                        "temperature 0: the paper's Mean tau over its 5 tasks (its own tree "
                        "settings, on GPUs)"}

# SpecVocab (Williams et al. 2026, arXiv 2602.13836) on Qwen3-8B, Spec-Bench, batch 1: mean
# acceptance length of its reproduced EAGLE-3 (32,000-row head) 4.78 and of SpecVocab (k = 2048)
# 5.01, throughput 235.1 -> 245.2 tokens/s. NOT read from the paper's own table (not readable
# here): from a summary of the paper (github.com/uni042/llm-paper-summary, papers/inference/
# 99-other-inference-systems/README.md), consistent with the authors' README (github.com/
# SamsungLabs/SpecVocab: "Qwen3 8B | 4.3%" average throughput gain; 245.2 / 235.1 = +4.3%).
# The full-vocabulary head's tau is not published there.
SPECVOCAB_TAU = {"eagle3_32k": 4.78, "specvocab_2048": 5.01,
                 "source": "SpecVocab (arXiv 2602.13836) on Qwen3-8B, Spec-Bench mean, as a "
                           "summary of the paper quotes it (the paper's table not read here; "
                           "consistent with the authors' README's +4.3% throughput)"}

# DFlash (Chen et al. 2026, arXiv 2602.06036v1) Table 1: Qwen3-8B with z-lab's DFlash drafter
# (block 16), temperature 0, thinking off, Transformers backend, one H200, up to 2,048 new
# tokens; (speedup, tau) per benchmark. NOT read from arXiv here (no network): from a
# transcription of the v1 HTML (github.com/aaronzhfeng/tpu-spec-decode,
# legacy/docs/dflash_paper.md); the mean of the seven taus is the table's Avg (6.49). The
# table's Avg speedup (4.86x) is the paper's own, not the mean of its columns.
DFLASH_GROUPS = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt_bench")
DFLASH_TABLE1 = {
    "dflash_b16": ((5.15, 6.54), (6.08, 7.87), (5.62, 7.08), (5.14, 6.50), (4.65, 5.95),
                   (5.51, 7.27), (2.75, 4.24)),
    "eagle3_tree16": ((1.94, 3.23), (1.81, 3.02), (1.79, 3.00), (1.89, 3.17), (1.69, 2.82),
                      (1.57, 2.65), (1.63, 2.83)),
}
DFLASH_TAU = {"qwen3_8b_b16": round(sum(t for _, t in DFLASH_TABLE1["dflash_b16"]) / 7, 2),
              "avg_speedup": 4.86,
              "source": "DFlash (arXiv 2602.06036v1) Table 1, Qwen3-8B, DFlash (16), "
                        "temperature 0: mean tau of its 7 benchmarks (one H200, Transformers "
                        "backend; read from a transcription of the paper's HTML)"}
