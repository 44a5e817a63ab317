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
