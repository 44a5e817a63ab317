"""One validation of every trainer's settings (train.loop.SETTINGS): a value that reverses or
voids the objective (a negative step decay, clip norm, weight decay or loss weight; lr 0; NaN)
is a TrainError naming the field, the value and its range, for the EAGLE, Medusa, ranker and
distillation jobs alike, before anything is written (before: EAGLE, Medusa and ranker jobs
accepted them and trained, exit 0)."""

import pytest

from vocabjax.train import eagle, medusa, ranker
from vocabjax.train.distill import job as distill
from vocabjax.train.loop import TrainError

BASE = {
    "eagle": (eagle.job_from_dict, {"target": "t", "data": ["d.jsonl"], "out": "o"}),
    "medusa": (medusa.job_from_dict, {"target": "t", "data": ["d.jsonl"], "out": "o"}),
    "ranker": (ranker.job_from_dict, {"drafter": "d", "data": ["d.jsonl"], "out": "o"}),
    "distill": (distill.job_from_dict, {"target": "t", "drafter": "d", "data": ["d.jsonl"],
                                        "out": "o"}),
}
CASES = [
    ("eagle", "step_decay", -0.5, r"step_decay=-0.5 is outside \(0, 1\]"),
    ("eagle", "step_decay", 1.5, r"step_decay=1.5 is outside \(0, 1\]"),
    ("eagle", "clip_norm", -1.0, r"clip_norm=-1.0 is outside \(0, inf\)"),
    ("eagle", "weight_decay", -0.01, r"weight_decay=-0.01 is outside \[0, inf\)"),
    ("eagle", "lr", 0.0, r"lr=0.0 is outside \(0, inf\)"),
    ("medusa", "step_decay", -0.8, r"step_decay=-0.8 is outside"),
    ("medusa", "clip_norm", 0.0, r"clip_norm=0.0 is outside \(0, inf\) .*trains nothing"),
    ("medusa", "weight_decay", -1.0, "weight_decay=-1.0 is outside"),
    ("ranker", "joint_lambda", -0.1, r"joint_lambda=-0.1 is outside \[0, inf\) \(a loss weight"),
    ("ranker", "clip_norm", -2.0, "clip_norm=-2.0 is outside"),
    ("ranker", "lr", float("nan"), "lr=nan must be (a )?finite"),
    ("distill", "clip_norm", -1.0, "clip_norm=-1.0 is outside"),
    ("distill", "lam", -0.2, "lam=-0.2"),
    ("distill", "head_lr", float("inf"), "head_lr=inf must be (a )?finite"),
]


@pytest.mark.parametrize("kind,field,value,match", CASES,
                         ids=[f"{k}-{f}={v}" for k, f, v, _ in CASES])
def test_settings_that_reverse_the_objective_are_refused(kind, field, value, match, tmp_path):
  make, raw = BASE[kind]
  raw = {**raw, "out": str(tmp_path / "out"), field: value}
  with pytest.raises(TrainError, match=match):
    make(raw)
  assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("kind", sorted(BASE))
def test_the_defaults_pass(kind):
  make, raw = BASE[kind]
  make(dict(raw))


@pytest.mark.parametrize("kind,field,value,match", [
    ("eagle", "feature_layers", 3, r"feature_layers must be a list of ints .*got 3"),
    ("eagle", "feature_layers", [1, "2"], r"feature_layers must be a list of ints, got '2'"),
    ("medusa", "feature_layers", "1,2", r"feature_layers must be a list of ints .*got '1,2'"),
    ("ranker", "recall_k", 256, r"recall_k must be a list of ints .*got 256"),
    ("eagle", "data", 3, r"data must be a list of strs .*got 3"),
])
def test_a_scalar_where_a_list_belongs_is_named(kind, field, value, match):
  """YAML scalars where a trainer takes a list (before: TypeError 'int' object is not
  iterable, or "1,2" taken as two characters)."""
  make, raw = BASE[kind]
  with pytest.raises(TrainError, match=match):
    make({**raw, field: value})
  make({**raw, "data": "one.jsonl"})  # a single path is a one-element list
