"""Trainers, each a `python -m vocabjax.train.<kind> --config configs/train/<recipe>.yaml`
command with a resumable orbax checkpoint, a JSONL log, curves and a summary:

  ranker    SpecVocab's low-rank vocabulary ranker for a drafter (`vocabjax.vocab.ranked`)
  eagle     an EAGLE-3 head for a target (exported as an EAGLE-3 checkpoint directory)
  distill   a cross-vocabulary drafter distilled from the target (OmniDraft: full or LoRA,
            offline or online, with an optional SpecDec++ acceptance head)

Shared pieces: `loop` (optimizer settings, checkpoints, logs, finite-loss checks, the job
config reader) and `features` (feature shards extracted from the frozen models).
"""
