"""The feature shards every trainer reads (`vocabjax.train.features.write_shards` /
`read_shards`): what is read back is what was written, shard after shard, records without rows
included, and a shard whose columns disagree is refused by name."""

import io

import numpy as np
import pytest

from vocabjax.io import atomic_write_bytes
from vocabjax.train.features import SHARD_RECORDS, read_shards, write_shards
from vocabjax.train.loop import TrainError


def _record_fn(rec):
  if rec["n"] == 0:
    return None  # an empty completion: no rows
  n = rec["n"]
  rng = np.random.default_rng(rec["id"])
  return {"feats": rng.standard_normal((n, 6)).astype(np.float16),
          "label": rng.integers(0, 50, n).astype(np.int32),
          "tokens": rng.integers(0, 50, n).astype(np.int32), "first_row": rec["id"] % 3}


def _records():
  # 2.5 shards of records; the whole second shard has empty completions
  n = [0 if SHARD_RECORDS <= i < 2 * SHARD_RECORDS else 1 + (7 * i) % 11
       for i in range(SHARD_RECORDS * 5 // 2)]
  return [{"id": i, "n": k} for i, k in enumerate(n)]


def test_read_shards_returns_what_was_written(tmp_path):
  records = _records()
  shards = -(-len(records) // SHARD_RECORDS)
  write_shards(tmp_path, {"fingerprint": "x"}, records, list(range(shards)), _record_fn,
               desc="test", show_progress=False)
  cat, seqs, meta = read_shards(tmp_path, ("feats", "label"))
  assert meta["complete"] and meta["shards"] == shards
  want = [(r["id"], _record_fn(r)) for r in records if r["n"]]
  np.testing.assert_array_equal(cat["feats"], np.concatenate([f["feats"] for _, f in want]))
  np.testing.assert_array_equal(cat["label"], np.concatenate([f["label"] for _, f in want]))
  np.testing.assert_array_equal(cat["record"],
                                np.concatenate([np.full(len(f["label"]), r) for r, f in want]))
  assert cat["feats"].dtype == np.float16 and cat["label"].dtype == np.int32
  assert [r for r, _, _ in seqs] == [r for r, _ in want]
  for (r, toks, first), (_, f) in zip(seqs, want):
    np.testing.assert_array_equal(toks, f["tokens"])
    assert first == f["first_row"]


def test_a_shard_whose_columns_disagree_is_refused(tmp_path):
  records = _records()
  write_shards(tmp_path, {"fingerprint": "x"}, records, [0, 1, 2], _record_fn, desc="test",
               show_progress=False)
  path = tmp_path / "shard-00002.npz"
  with np.load(path) as z:
    arrays = {k: z[k] for k in z.files}
  arrays["feats"] = arrays["feats"][:-1]  # one row short of its `record` column
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  atomic_write_bytes(path, buf.getvalue())
  with pytest.raises(TrainError, match=r"shard-00002\.npz holds \d+ rows of 'feats'"):
    read_shards(tmp_path, ("feats", "label"))
  path.write_bytes(path.read_bytes()[:100])  # truncated
  with pytest.raises(TrainError, match=r"shard-00002\.npz is missing or corrupt"):
    read_shards(tmp_path, ("feats", "label"))


def test_a_deleted_shard_of_a_complete_build_is_computed_again(tmp_path):
  """The loader says "delete it and rerun" of a corrupt shard: the rerun must rebuild it,
  although meta.json says the build was complete."""
  from vocabjax.train.features import pending_shards

  records = _records()
  shards = -(-len(records) // SHARD_RECORDS)
  write_shards(tmp_path, {"fingerprint": "x"}, records, list(range(shards)), _record_fn,
               desc="test", show_progress=False)
  assert pending_shards(tmp_path, "x", len(records)) == []
  before = read_shards(tmp_path, ("feats", "label"))[0]
  (tmp_path / "shard-00001.npz").unlink()
  todo = pending_shards(tmp_path, "x", len(records))
  assert todo == [1]
  write_shards(tmp_path, {"fingerprint": "x"}, records, todo, _record_fn, desc="test",
               show_progress=False)
  after = read_shards(tmp_path, ("feats", "label"))[0]
  np.testing.assert_array_equal(after["feats"], before["feats"])
  with pytest.raises(TrainError, match="holds features of other data or models"):
    pending_shards(tmp_path, "y", len(records))
