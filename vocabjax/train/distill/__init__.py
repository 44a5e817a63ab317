"""`python -m vocabjax.train.distill --config configs/train/distill_*.yaml`: hybrid distillation
of a cross-vocabulary drafter (OmniDraft section 3.3), full fine-tuning or LoRA, and the SpecDec++
acceptance head (adaptive draft length).

Letters: Ld drafter sequence, Kd direct-mapped positions, Kn n-gram sub-token positions,
Vi vocabulary intersection, Dd / Dt drafter / target hidden sizes.

Data: target completions (`prompt` text + `completion_ids`, the jsonl of
`python -m vocabjax.calibrate count --generate`, or what an online run generated). The drafter
reads the prompt retokenized as a whole and each completion token by its reverse translation
(`vocabjax.vocab.translate.Translator`): the same context it has when drafting. Completion
token i of the target is then
  * direct-mapped (the drafter spells it with one shared token): the drafter's distribution at
    the position before it, restricted to the intersection and renormalized (q_I), is pulled
    towards the target's restricted the same way (p_I) by the reverse KL
    L_DM = KL(q_I || p_I) (mode-seeking: the drafter concentrates where the target is sure);
  * an n-gram token (the drafter spells it with k >= 2 tokens): L_ngram = NLL of the drafter's
    k sub-tokens (the n-gram cache can only merge what the drafter proposes in that order).
  L = L_DM + lambda * L_ngram (lambda = 0.2 in OmniDraft; 0 gives the "+ L_DM" row).
The target's side is computed once per record (`features/`, resumable): its final hidden
states at the completion positions (the intersection logits are recomputed from them with its
LM head's intersection rows, so no 150K-wide distribution is stored), the log-normalizer of its
full softmax there, and its argmax.

Acceptance head (SpecDec++, `acceptance: joint | interleaved`): at each direct-mapped position
the drafter's greedy proposal x (argmax of q_I); label y = min(1, p(x) / q_I(x)) (`acceptance_
label: ratio`, the acceptance probability of speculative sampling, p the target's full softmax)
or 1[x is the target's argmax] (`greedy`, what greedy verification accepts); weighted BCE
-[y log a + w (1 - y) log(1 - a)] with w = `rejection_weight`. `joint`: one loss
L + mu * L_acc, gradients into the drafter too; `interleaved`: alternate steps, the head's with
the drafter frozen.

LoRA (`lora_rank: 32`): adapters on every attention and MLP projection
(`vocabjax.models.lora`), the base frozen; otherwise every drafter weight trains.

Output `out/`: `checkpoints/` (orbax, resumable: rerun the command), `log.jsonl`,
`curves.png`, and `drafter/` (`distill.json`, `drafter.safetensors` = the LoRA adapter or the
full params, `head.safetensors` when an acceptance head was trained), read by
`load_distilled` and the eval method `crossvocab` (`drafter: out/drafter`).

Online mode (`--online`, OmniDraft's fig. 2 setting, `online`): the drafter serves a prompt
stream and learns from it as it goes; each prompt is decoded with the drafter of that moment
(trained only on earlier prompts), so acceptance and speedup are prequential. Output
`online.jsonl` (one row per prompt), `online.png`, `online_summary.json`, and for resuming
`checkpoints/`, `online_side/` (the target side of every completion learned from) and
`online_ngram/` (the n-gram cache after each update). `online_steps: 0` runs the control: the
same stream with the drafter frozen.

Modules: `job` (the job and its models), `data` (alignment, the target side), `losses`,
`trainer` (`Distiller`, `train`, `export`), `online`, `__main__` (the command line); the
exported format is `vocabjax.checkpoints.distilled`.
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
