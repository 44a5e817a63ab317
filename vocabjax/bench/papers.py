"""The papers' pairs at their published sizes, for `python -m vocabjax.bench tpu --paper NAME`.

Each pair is a paper's target with the drafting head it published (or the head of the size its
setting names), the paper's tree, and one row per method the paper measured, with the paper's
own mean acceptance length (`vocabjax.eval.published`). The projection compiles each row's
whole step for a TPU topology (deviceless, abstract weights of these shapes: nothing is
downloaded) and turns the published tau into a PROJECTED speedup tau x t(ar) / t(method) from
the compiled programs' costs: what the paper's acceptance would buy on that TPU if the step
costs what XLA's cost analysis says. A row without a published tau is compiled and costed,
with no speedup.

    python -m vocabjax.bench tpu --paper frspec-llama3 --topology v6e:1x1 --out DIR

The heads' shapes, from their authors' config.json files as the loaders read them
(`checkpoints/eagle2.py`, `checkpoints/eagle3.py`): an EAGLE-1/2 head is one decoder layer of
the target's sizes over [embedding; feature] and the target's own LM head; an EAGLE-3 head is
one layer whose attention reads [embedding; fused feature] (2D wide), an fc fusing three of the
target's layers (3D -> D) and its own LM head over a draft vocabulary (d2t).
"""

from __future__ import annotations

import dataclasses

from vocabjax.eval.published import (DFLASH_TAU, EAGLE3_TAU, FRSPEC_GROUPS, FRSPEC_TAU,
                                     SPECVOCAB_TAU)

__all__ = ["PAPER_PAIRS", "PaperPair", "PaperRow"]

# EAGLE-2's tree at its evaluation defaults (EAGLE's --total-token 60 --depth 5 --top-k 10, as
# FR-Spec ran it; vocabjax counts the nodes besides the root and the levels below it)
EAGLE2_TREE = "eagle:top_k=10,depth=6,total_tokens=59"


@dataclasses.dataclass(frozen=True)
class PaperRow:
  label: str  # the paper's name for the row
  method: str  # its step as `bench tpu` names methods (registry form | bench settings)
  tau: float | None  # the paper's mean acceptance length, None where it published none
  source: str  # where tau comes from (paper, table, what was averaged), or why there is none


@dataclasses.dataclass(frozen=True)
class PaperPair:
  key: str
  paper: str  # the paper and its setting
  target: str  # a key of vocabjax.checkpoints.known.KNOWN
  head: str  # the published head (hub id) whose shapes these are
  head_kind: str  # "eagle2", "eagle3" or "dflash" (a block drafter over the target's head)
  head_vocab: int  # the head's own LM-head rows (an EAGLE-1/2 head: the target's V)
  head_intermediate: int
  rows: tuple[PaperRow, ...]
  ranker_rank: int = 128  # SpecVocab's ranker: [V, R] and [R, D]
  head_layers: int = 1  # a DFlash drafter's layers (head_kind "dflash")
  head_layer_ids: tuple[int, ...] | None = None  # the target layers a DFlash drafter reads


def _mean(values) -> float:
  return round(sum(values) / len(values), 3)


def _frspec(key: str) -> PaperRow:
  k = {"64k": 65536, "32k": 32768, "16k": 16384, "8k": 8192}.get(key)
  src = (f"FR-Spec (arXiv 2502.14856v2) Table 1, Llama-3-8B, row "
         f"{'EAGLE-2' if k is None else 'FR-Spec ' + key.upper()}: mean of its "
         f"{len(FRSPEC_GROUPS)} columns")
  if k is None:
    return PaperRow("EAGLE-2 (full vocabulary)", EAGLE2_TREE, _mean(FRSPEC_TAU["full"]), src)
  return PaperRow(f"FR-Spec {key.upper()}", f"{EAGLE2_TREE}|subset_k={k}",
                  _mean(FRSPEC_TAU[key]), src)


# The newer vocabulary methods on that head, at their papers' settings where an abstract or
# reference code states them; none of them published an absolute tau that could be read here
# (docs/vocab_methods.md has their published claims)
NEWER_ROWS = (
    PaperRow("DynaSpec, top 4 of 64 clusters", f"{EAGLE2_TREE}|policy=dynaspec;top=4;clusters=64",
             None, "DynaSpec (arXiv 2510.13847v3) abstract: 98.4% of the full head's mean "
             "accepted length on Llama-3-8B; cluster counts not stated (vocabjax's 64, top 4)"),
    PaperRow("MicroSpec, core 512 + 2,560 in-context", f"{EAGLE2_TREE}|policy=microspec;core=512;"
             "window=2560", None, "MicroSpec (arXiv 2605.26444) abstract: under 3K active "
             "tokens, 1.12-1.32x over EAGLE-2; no tau read here"),
    PaperRow("SlimSpec, rank 512 (d/8)", f"{EAGLE2_TREE}|policy=slimspec;rank=512", None,
             "SlimSpec (arXiv 2605.10453) abstract: 4-5x faster head, rank d/8 from a third "
             "party's notes; no tau read here"),
    PaperRow("coverage-latency k* = 13,264", f"{EAGLE2_TREE}|subset_k=13264", None,
             "k* of the paper's reference code for Llama-3.1-8B (arXiv 2603.05210); no tau "
             "read here"),
    PaperRow("EvoSpec, base 32K + 1,024 evolving", f"{EAGLE2_TREE}|policy=evospec;base=32768;"
             "window=1024", None, "EvoSpec (arXiv 2605.27390) abstract: 1.13x over FR-Spec "
             "32K on EAGLE-3; window and index sizes are vocabjax's"),
)

PAPER_PAIRS: dict[str, PaperPair] = {
    # FR-Spec's and VocabTrim's setting: the EAGLE authors' EAGLE-2 head for Llama-3-8B-Instruct
    # over the target's 128,256-row LM head, restricted to a static frequency-ranked subset
    # (VocabTrim's 32K subset runs FR-Spec 32K's program: only which rows differ)
    "frspec-llama3": PaperPair(
        "frspec-llama3", "FR-Spec (Zhao et al. 2025, arXiv 2502.14856): EAGLE-2 on "
        "Llama-3-8B-Instruct, Spec-Bench + HumanEval, greedy, 1x A800",
        "llama-3-8b-instruct", "yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle2", 128256, 14336,
        tuple(_frspec(k) for k in ("full", "64k", "32k", "16k", "8k")) + NEWER_ROWS),
    # EAGLE-3 with its authors' head for Llama-3.1-8B-Instruct (its own 32,000-row vocabulary)
    "eagle3-llama31": PaperPair(
        "eagle3-llama31", "EAGLE-3 (Li et al. 2025, arXiv 2503.01840): Llama-3.1-8B-Instruct, "
        "MT-bench, HumanEval, GSM8K, Alpaca, CNN/DM, greedy",
        "llama-3.1-8b-instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3", 32000, 14336,
        (PaperRow("EAGLE-3 (32K head), EAGLE-2 tree", EAGLE2_TREE, EAGLE3_TAU["llama31_8b"],
                  EAGLE3_TAU["source"]),
         PaperRow("EAGLE-3 (32K head), chain of 6", "eagle:top_k=1,depth=6,total_tokens=6",
                  None, "the paper measured trees, not chains: no published tau"))),
    # SpecVocab's setting: Qwen3-8B with an EAGLE-3 head; the 32K-head baseline, the head
    # drafting over the whole vocabulary, and SpecVocab's per-step k = 2048 of it
    "specvocab-qwen3": PaperPair(
        "specvocab-qwen3", "SpecVocab (Williams et al. 2026, arXiv 2602.13836): Qwen3-8B with "
        "EAGLE-3 heads, Spec-Bench, batch 1, H100 (SGLang)",
        "qwen3-8b", "SpecVocab's EAGLE-3 head for Qwen3-8B (configs/Qwen3-8B-eagle3.json of "
        "github.com/SamsungLabs/SpecVocab: D 4096, F 12288, 32,000 draft rows)", "eagle3",
        32000, 12288,
        (PaperRow("EAGLE-3 (32K head)", EAGLE2_TREE, SPECVOCAB_TAU["eagle3_32k"],
                  SPECVOCAB_TAU["source"]),
         PaperRow("EAGLE-3 (full-vocabulary head)", f"{EAGLE2_TREE},lm_head=target", None,
                  "no published tau at hand for a full-vocabulary EAGLE-3 head on Qwen3-8B"),
         PaperRow("SpecVocab k=2048", f"{EAGLE2_TREE},lm_head=target,ranker=x,k=2048",
                  SPECVOCAB_TAU["specvocab_2048"], SPECVOCAB_TAU["source"])),
        # its vocabulary speculator's width (configs/Qwen3-8B-specvocab-eagle3.json of
        # github.com/SamsungLabs/SpecVocab: "vocabulary_speculator": {"intermediate_size": 512})
        ranker_rank=512),
    # DFlash's setting: z-lab's block drafter for Qwen3-8B (z-lab/Qwen3-8B-DFlash-b16: 5 Qwen3
    # layers of the target's width, MLP 12288, reading target layers 1, 9, 17, 25, 33, blocks of
    # 16; as sglang-jax's docs/architecture/dflash_tpu_v6e1.md and speculators' converter test
    # quote its config.json, not read here) drafting through the target's whole 151,936-row LM
    # head at 15 positions a pass; trimmed to a static subset or SpecVocab's candidates, which
    # nobody has published an acceptance length for
    "dflash-qwen3": PaperPair(
        "dflash-qwen3", "DFlash (Chen et al. 2026, arXiv 2602.06036): Qwen3-8B with z-lab's "
        "DFlash drafter (block 16), GSM8K, MATH-500, AIME25, HumanEval, MBPP, LiveCodeBench, "
        "MT-Bench, greedy, one H200",
        "qwen3-8b", "z-lab/Qwen3-8B-DFlash-b16", "dflash", 151936, 12288,
        (PaperRow("DFlash (16), full vocabulary", "dflash", DFLASH_TAU["qwen3_8b_b16"],
                  DFLASH_TAU["source"]),
         PaperRow("DFlash (16) + FR-Spec 32K", "dflash|subset_k=32768", None,
                  "no published tau for a DFlash drafter over a trimmed head"),
         PaperRow("DFlash (16) + FR-Spec 8K", "dflash|subset_k=8192", None,
                  "no published tau for a DFlash drafter over a trimmed head"),
         PaperRow("DFlash (16) + SpecVocab k=2048", "dflash:ranker=x,k=2048", None,
                  "no published tau for a DFlash drafter over SpecVocab's candidates")),
        ranker_rank=512, head_layers=5, head_layer_ids=(1, 9, 17, 25, 33)),
}
