"""An EAGLE-3 training job's settings (`python -m vocabjax.train.eagle --config ...`: the module
doc of `vocabjax.train.eagle` says what each does), read by its data, its step and its driver."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vocabjax.train.features import files_key, job_fingerprint
from vocabjax.train.loop import OptimConfig, TrainError, check_settings, train_fingerprint


@dataclasses.dataclass(frozen=True)
class EagleJob:
  target: str  # registry name or path of the target
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  # feature shards directory (default <out>/features), or one directory per data file (a
  # list as long as `data`: each file's features are built and kept apart, so a job over
  # several files reuses the features another job built for one of them)
  features: str | tuple[str, ...] | None = None
  feature_layers: tuple[int, ...] | None = None  # default: (1, L/2 - 1, L - 4)
  feature_backend: str = "jax"  # "jax" (vocabjax's forward) or "torch" (transformers')
  feature_dtype: str = "float32"  # the torch backend's model dtype (float32 | bfloat16)
  final_hidden: bool = False  # also store the final normed hidden state (Medusa heads train on it)
  draft_vocab_size: int | None = 32768  # None: the full V
  vocab_subset: str | None = None  # a VocabSubset file instead of counting labels
  vocab_counts: tuple[str, ...] = ()  # calibration counts (.npz) counted beside the labels
  train_lm_head: bool = True
  intermediate_size: int | None = None  # the head's MLP width (default: the target's)
  ttt_steps: int = 4  # J (EAGLE-3 trains 7)
  step_decay: float = 0.8
  seq_len: int = 512  # window T
  batch_size: int = 2
  steps: int = 1000
  lr: float = 3e-4
  warmup_steps: int = 50
  weight_decay: float = 0.0
  clip_norm: float = 0.5
  heldout: float = 0.1
  heldout_split: str = "last"  # "last" prompts or a "random" sample of them (seed)
  eval_every: int = 100
  checkpoint_every: int = 100
  select_by: str | None = "heldout_loss"  # None: export the last step
  seed: int = 0
  vocab_block: int = 16384
  max_records: int | None = None
  train_fraction: float = 1.0  # train on a fraction of the training records (ablations)
  train_subset: str = "first"  # which fraction: the "first" records or a "random" (seed) sample
  pack: bool = False  # fill each window with several records' windows (`make_packed_batch`)
  init_head: str | None = None  # an exported head to start from (fine-tuning; module doc)
  compute_dtype: str = "float32"  # "bfloat16": mixed precision (`Lowering.bf16_dots`)
  prompt_labels: bool = False  # also train on the prompt's positions (module doc)
  soft_labels: bool = False  # the target's distribution as the label (needs final_hidden)

  def __post_init__(self):
    check_settings(self)
    if not self.data:
      raise TrainError("no data files given")
    if isinstance(self.features, list):  # YAML gives lists; a str stays a str (fingerprints)
      object.__setattr__(self, "features", tuple(self.features))
    if isinstance(self.features, tuple):
      if len(self.features) != len(self.data):
        raise TrainError(f"features lists {len(self.features)} directories for "
                         f"{len(self.data)} data files: give one per file, or one directory")
      if self.max_records is not None:
        raise TrainError(f"max_records={self.max_records} needs one features directory (it "
                         f"counts records over all data files)")
      if len({str(Path(f).resolve()) for f in self.features}) != len(self.features):
        raise TrainError(f"features={list(self.features)} names a directory twice")
    if not 0 < self.train_fraction <= 1:
      raise TrainError(f"train_fraction={self.train_fraction} must be in (0, 1]")
    if self.ttt_steps < 1:
      raise TrainError(f"ttt_steps={self.ttt_steps} must be >= 1")
    if self.seq_len < 2 or self.batch_size < 1:
      raise TrainError(f"need seq_len >= 2 and batch_size >= 1, got seq_len={self.seq_len}, "
                       f"batch_size={self.batch_size}")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if self.train_subset not in ("first", "random"):
      raise TrainError(f"train_subset={self.train_subset!r} is not 'first' or 'random'")
    if self.heldout_split not in ("last", "random"):
      raise TrainError(f"heldout_split={self.heldout_split!r} is not 'last' or 'random'")
    if self.vocab_subset and self.draft_vocab_size is not None:
      raise TrainError("give either vocab_subset or draft_vocab_size, not both")
    if self.init_head and Path(self.init_head).resolve() == (Path(self.out) / "head").resolve():
      raise TrainError(f"init_head={self.init_head!r} is where this job exports its own head: "
                       f"copy it elsewhere or use another out")
    if self.init_head and (self.vocab_subset or self.vocab_counts):
      raise TrainError(f"init_head={self.init_head!r} keeps that head's vocabulary: drop "
                       f"vocab_subset and vocab_counts")
    if self.feature_backend not in ("jax", "torch"):
      raise TrainError(f"feature_backend={self.feature_backend!r} is not 'jax' or 'torch'")
    if self.feature_backend == "jax" and self.feature_dtype != "float32":
      raise TrainError(f"feature_dtype={self.feature_dtype!r} needs feature_backend: torch (the "
                       f"jax backend computes features with the target as loaded, f32)")
    if self.feature_dtype not in ("float32", "bfloat16"):
      raise TrainError(f"feature_dtype={self.feature_dtype!r} is not float32 or bfloat16")
    if self.compute_dtype not in ("float32", "bfloat16"):
      raise TrainError(f"compute_dtype={self.compute_dtype!r} is not float32 or bfloat16")
    if self.soft_labels and not self.final_hidden:
      raise TrainError("soft_labels: true needs final_hidden: true (the target's distribution "
                       "is computed from its final hidden states, stored with the features)")
    if self.select_by not in (None, "heldout_loss", "acc_0"):
      raise TrainError(f"select_by={self.select_by!r} is not 'heldout_loss', 'acc_0' or null")
    self.optim  # validated before any features are built

  @property
  def optim(self) -> OptimConfig:
    return OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, total_steps=self.steps,
                       weight_decay=self.weight_decay, clip_norm=self.clip_norm)

  @property
  def features_dir(self) -> Path:
    if isinstance(self.features, tuple):
      raise TrainError(f"this job keeps its features in {len(self.features)} directories, one "
                       f"per data file: read them with feature_parts")
    return Path(self.features) if self.features else Path(self.out) / "features"

  @property
  def feature_parts(self) -> list[tuple[Path, tuple[str, ...]]]:
    """(directory, data files) of each features directory: one for all files, or one each."""
    if isinstance(self.features, tuple):
      return [(Path(f), (d,)) for f, d in zip(self.features, self.data)]
    return [(self.features_dir, self.data)]

  @property
  def feature_location(self) -> Path | list[Path]:
    """What `load_eagle_features` reads for this job: its directory, or the list of them."""
    dirs = [d for d, _ in self.feature_parts]
    return dirs if isinstance(self.features, tuple) else dirs[0]

  def feature_fingerprint(self, layers, data=None) -> str:
    """The features of `data` (default: all the job's files) as this job computes them: a
    one-file directory of a per-file job is the features of a job over that file alone."""
    extra = (() if self.feature_backend == "jax"  # the defaults: the fingerprint as before
             else (self.feature_backend, self.feature_dtype)) + (
                 ("final_hidden",) if self.final_hidden else ())
    return job_fingerprint("eagle", self.target, files_key(self.data if data is None else data),
                           list(layers), self.max_records, *extra)

  def train_fingerprint(self) -> str:
    # init_head: the head's file and its export record (another head at the same path is
    # another job), so a resumed fine-tuning run starts from the head it started from
    replace = {"init_head": head_identity(self.init_head)} if self.init_head else None
    return train_fingerprint(self, replace=replace,
                             new_defaults={"train_fraction": 1.0, "pack": False,
                                           "init_head": None, "heldout_split": "last",
                                           "train_subset": "first",
                                           "compute_dtype": "float32",
                                           "prompt_labels": False, "soft_labels": False})


def head_identity(directory) -> list:
  """What a training fingerprint remembers of an `init_head`: its weights file (path, size)
  and the record its exporter wrote (the job and the step it was exported at)."""
  directory = Path(directory)
  cfg, weights = directory / "config.json", directory / "model.safetensors"
  for f in (cfg, weights):
    if not f.is_file():
      raise TrainError(f"init_head={str(directory)!r}: {f} does not exist (not an exported "
                       f"EAGLE-3 head directory)")
  try:
    rec = json.loads(cfg.read_text()).get("vocabjax", {})
  except json.JSONDecodeError as e:
    raise TrainError(f"init_head={str(directory)!r}: {cfg} is not JSON ({e})") from None
  return files_key([weights]) + [{k: rec.get(k) for k in ("job", "row")}]
