"""The distillation job (`configs/train/distill_*.yaml`) and its models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vocabjax.checkpoints.loader import load_model
from vocabjax.train.features import files_key, job_fingerprint
from vocabjax.train.loop import TrainError, check_settings, job_fields


@dataclasses.dataclass(frozen=True)
class DistillJob:
  target: str  # registry name, HF dir or .gguf
  drafter: str
  data: tuple[str, ...]  # completion jsonl files
  out: str
  features: str | None = None  # target-side cache (default: out/features)
  lam: float = 0.2  # lambda of L_ngram
  lora_rank: int = 0  # 0: full fine-tuning
  lora_alpha: float = 32.0
  acceptance: str = "none"  # none | joint | interleaved
  acceptance_label: str = "ratio"  # ratio: min(1, p/q); greedy: 1[x == target argmax]
  rejection_weight: float = 3.0
  acceptance_mu: float = 1.0  # weight of L_acc in the joint loss
  head_width: int = 256
  steps: int = 100
  lr: float = 5e-5
  head_lr: float = 1e-3
  warmup_steps: int = 10
  clip_norm: float = 1.0
  weight_decay: float = 0.0
  max_records: int | None = None
  max_tokens: int = 512  # drafter tokens per sequence (longer prompts keep their end)
  heldout: float = 0.1  # last fraction of records, for the held-out figures
  eval_every: int = 25
  checkpoint_every: int = 25
  seed: int = 0
  # online mode (`--online`): generate over a prompt stream with the cross-vocabulary decoder
  # and update the drafter after every `online_every` sequences (OmniDraft fig. 2)
  online: tuple = ()  # eval dataset specs, e.g. ({kind: gsm8k, limit: 16},)
  online_every: int = 4
  online_steps: int = 8  # optimizer steps per update, on records drawn from all seen so far;
  # 0: the control (the same stream, the drafter frozen)
  gamma: int = 4
  max_new_tokens: int = 128

  def __post_init__(self):
    if self.acceptance not in ("none", "joint", "interleaved"):
      raise TrainError(f"acceptance={self.acceptance!r} must be none, joint or interleaved")
    if self.acceptance_label not in ("ratio", "greedy"):
      raise TrainError(f"acceptance_label={self.acceptance_label!r} must be ratio or greedy")
    if self.lam < 0 or self.lora_rank < 0 or self.steps < 1:
      raise TrainError(f"need lam >= 0, lora_rank >= 0, steps >= 1; got lam={self.lam}, "
                       f"lora_rank={self.lora_rank}, steps={self.steps}")
    if not 0 <= self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in [0, 1)")
    check_settings(self)  # the optimizer's and the losses' numbers (train.loop.SETTINGS)
    if self.online_every < 1 or self.online_steps < 0:
      raise TrainError(f"need online_every >= 1 and online_steps >= 0; got online_every="
                       f"{self.online_every}, online_steps={self.online_steps}")

  @property
  def features_dir(self) -> Path:
    return Path(self.features or Path(self.out) / "features")

  def feature_fingerprint(self) -> str:
    return job_fingerprint("distill-features", self.target, self.drafter,
                           files_key(self.data), self.max_records, self.max_tokens)

  def train_fingerprint(self) -> str:
    d = dataclasses.asdict(self)
    for k in ("out", "features", "eval_every", "checkpoint_every", "steps"):
      d.pop(k)
    return job_fingerprint(self.feature_fingerprint(), d)

  def online_fingerprint(self) -> str:
    """What an online run's checkpoints depend on (the stream, not `data`)."""
    d = dataclasses.asdict(self)
    for k in ("out", "features", "eval_every", "checkpoint_every", "steps", "data",
              "max_records"):
      d.pop(k)
    return job_fingerprint("distill-online", d)


def job_from_dict(raw: dict, *, where: str = "config") -> DistillJob:
  raw = job_fields({"data": (), **raw}, DistillJob, ("target", "drafter", "out"), where=where)
  if raw.get("online"):
    raw["online"] = tuple(raw["online"])
  return DistillJob(**raw)


def load_model_for(source: str, what: str, progress: bool = True):
  """`load_model` in float32, with a missing or unreadable model as a TrainError naming it.
  float32 whatever the file: distillation trains the drafter (its adapters merge into float
  weights) and reads the target's logits as the f32 model's; a .gguf file would otherwise load
  as its quantized blocks (`load_model`'s default)."""
  try:
    return load_model(source, dtype="float32", progress=progress)
  except Exception as e:  # noqa: BLE001 -- any loader failure (missing, truncated, corrupt)
    raise TrainError(f"cannot load the {what} {source!r}: {type(e).__name__}: {e}") from e
