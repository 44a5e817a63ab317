"""vocabjax.io's JSON-lines records: an interrupted write never costs a later record."""

import json

import pytest

from vocabjax.io import append_jsonl, read_jsonl


def test_a_file_holding_only_a_torn_line_is_repaired_before_the_next_append(tmp_path):
  p = tmp_path / "rows.jsonl"
  p.write_text('{"a": 1, "b"')  # the first record's write was interrupted
  assert read_jsonl(p) == []
  assert p.read_text() == ""  # repaired even though no record survived
  append_jsonl(p, {"a": 2})
  assert read_jsonl(p) == [{"a": 2}]


def test_append_never_glues_onto_a_torn_tail(tmp_path):
  p = tmp_path / "rows.jsonl"
  p.write_text('{"a": 1}\n{"a": 2, "b')  # torn, and nobody read the file before appending
  append_jsonl(p, {"a": 3})
  assert read_jsonl(p) == [{"a": 1}, {"a": 3}]
  q = tmp_path / "q.jsonl"
  q.write_text('{"a": 1}')  # a whole record whose newline was not written
  append_jsonl(q, {"a": 2})
  assert read_jsonl(q) == [{"a": 1}, {"a": 2}]
  assert q.read_text() == '{"a": 1}\n{"a": 2}\n'


def test_a_corrupt_line_before_the_last_is_refused_by_name(tmp_path):
  p = tmp_path / "rows.jsonl"
  p.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
  with pytest.raises(ValueError, match=r"rows.jsonl:2 is corrupt"):
    read_jsonl(p)
  assert p.read_text() == '{"a": 1}\nnot json\n{"a": 3}\n'  # left as it was
  assert read_jsonl(tmp_path / "absent.jsonl") == []
  append_jsonl(tmp_path / "new.jsonl", {"x": [1, 2]})
  assert json.loads((tmp_path / "new.jsonl").read_text()) == {"x": [1, 2]}


def test_plots_keep_the_process_matplotlib_backend_and_leave_no_figures(tmp_path):
  """Reports, calibration plots and training curves draw on bare Figures: a notebook's backend
  (here svg, standing in for an inline one) survives them, pyplot holds no figure after them,
  and each file is a whole PNG."""
  import matplotlib
  import matplotlib.pyplot as plt
  import numpy as np

  from vocabjax.calibrate.counts import Counts, plot
  from vocabjax.eval.report import plots
  from vocabjax.train.loop import plot_curves

  before = matplotlib.get_backend()
  matplotlib.use("svg")
  try:
    plt.close("all")
    c = Counts(counts=np.bincount(np.random.RandomState(0).zipf(1.5, 300).clip(0, 49),
                                  minlength=50), meta={})
    paths = plot({"a": c}, tmp_path / "cal")
    plot_curves([{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)], ["loss"],
                tmp_path / "curves.png", "loss")
    summary = {"suite": "s", "groups": ["g"], "methods": [
        {"name": "chain", "method": "chain", "draft_vocab_size": 8,
         "overall": {"speedup": 1.2, "tau": 2.0}, "by_group": {"g": {"speedup": 1.2}}}]}
    paths += plots(summary, tmp_path) + [tmp_path / "curves.png"]
    assert matplotlib.get_backend() == "svg"
    assert plt.get_fignums() == []
    for p in paths:
      assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
  finally:
    matplotlib.use(before)


def test_reading_without_repair_leaves_a_file_being_written_alone(tmp_path):
  p = tmp_path / "rows.jsonl"
  p.write_text('{"a": 1}\n{"a": 2, "b')  # another process is mid-append
  assert read_jsonl(p, repair=False) == [{"a": 1}]
  assert p.read_text() == '{"a": 1}\n{"a": 2, "b'
  assert read_jsonl(p) == [{"a": 1}] and p.read_text() == '{"a": 1}\n'  # the default repairs


def test_a_complete_corrupt_last_line_is_an_error_not_a_torn_write(tmp_path):
  """Only an unterminated last line is a torn write. A newline-terminated last line that does
  not parse was written whole and damaged since: an error naming file:line, the file kept
  (before: dropped as torn, and the file rewritten, to 0 bytes when it was the only line)."""
  p = tmp_path / "rows.jsonl"
  for text, line in (('{"a": 1}\n{"a": 2, "b\n', 2), ('garbage\n', 1)):
    p.write_text(text)
    with pytest.raises(ValueError, match=rf"rows.jsonl:{line} is corrupt \(the last line, but "
                       r"complete"):
      read_jsonl(p)
    assert p.read_text() == text
    with pytest.raises(ValueError, match="is corrupt"):
      read_jsonl(p, repair=False)
