"""`python -m vocabjax.train.distill --config configs/train/distill_*.yaml`: hybrid distillation
of a cross-vocabulary drafter (OmniDraft section 3.3), full fine-tuning or LoRA, and the SpecDec++
acceptance head (adaptive draft length). Letters: Ld drafter sequence, Kd direct-mapped
positions, Kn n-gram sub-token positions, Vi vocabulary intersection, Dd / Dt hidden sizes.

Data: target completions (`prompt` + `completion_ids`: `python -m vocabjax.calibrate count
--generate`, or an online run's), read by the drafter as when drafting (the prompt retokenized,
each completion token by its reverse translation). A token the drafter spells with one shared
token trains by the reverse KL L_DM = KL(q_I || p_I) of both laws restricted to the
intersection, one it spells with k >= 2 tokens by L_ngram, the NLL of its sub-tokens:
L = L_DM + lambda * L_ngram (OmniDraft: lambda = 0.2). The target's side (final hidden states,
log-normalizer, argmax at the completion positions) is computed once per record (`features/`).
Acceptance head (`acceptance: joint | interleaved`): at each direct-mapped position, for the
drafter's greedy x, y = min(1, p(x) / q_I(x)) (`acceptance_label: ratio`) or 1[x is the target's
argmax] (`greedy`), a BCE weighting rejections by `rejection_weight`; `joint` adds mu * L_acc to
L, `interleaved` alternates steps with the drafter frozen. `lora_rank: 32`: LoRA adapters on every
attention and MLP projection (`vocabjax.models.lora`); otherwise every drafter weight trains.

Output `out/`: `checkpoints/` (orbax: rerun to resume), `log.jsonl`, `curves.png`, `drafter/`
(`distill.json`, `drafter.safetensors`, `head.safetensors` with a head) for `load_distilled` and
eval's `crossvocab` (`drafter: out/drafter`). `--online` (OmniDraft's fig. 2): each prompt of a
stream decoded by the drafter trained on the earlier ones (`online.jsonl`, `online.png`,
`online_summary.json`; `online_side/`, `online_ngram/` to resume); `online_steps: 0` freezes it.
"""

from vocabjax.train.distill.data import (Example, align, build_target_side, target_side_record,
                                         target_side_runner)
from vocabjax.train.distill.job import DistillJob, job_from_dict
from vocabjax.train.distill.losses import acceptance_terms, distill_terms
from vocabjax.train.distill.online import online
from vocabjax.train.distill.trainer import Distiller, export, train

__all__ = ["Distiller", "DistillJob", "Example", "acceptance_terms", "align", "build_target_side",
           "distill_terms", "export", "job_from_dict", "online", "target_side_record",
           "target_side_runner", "train"]
