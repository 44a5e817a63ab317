"""Static vocabulary subsets: selection rules, the d2t/t2d convention, save/load, bad input."""

import numpy as np
import pytest

from vocabjax.vocab import SubsetError, VocabSubset, select

COUNTS = np.array([5, 0, 9, 9, 1, 0, 30, 2, 0, 4])  # V = 10, total 60


def test_top_k_keeps_specials_and_breaks_ties_by_id():
  sub = select(COUNTS, k=4, keep=[8])  # 8 never occurs but is EOS
  assert sub.ids.tolist() == [2, 3, 6, 8]  # 6 (30), then 2 and 3 (9, lower id first)
  assert sub.size == 4 and sub.vocab_size == 10
  assert dict(sub.meta)["rule"] == "k=4" and dict(sub.meta)["token_total"] == 60


def test_top_p_and_min_count():
  # mass by rank: 6 -> .5, 2 -> .65, 3 -> .8, 0 -> .883, 9 -> .95
  assert select(COUNTS, top_p=0.8).ids.tolist() == [2, 3, 6]
  assert select(COUNTS, top_p=0.81).ids.tolist() == [0, 2, 3, 6]
  assert select(COUNTS, top_p=1.0).ids.tolist() == [0, 2, 3, 4, 6, 7, 9]
  assert select(COUNTS, min_count=4, keep=[1]).ids.tolist() == [0, 1, 2, 3, 6, 9]
  assert select(COUNTS, min_count=30).ids.tolist() == [6]
  with pytest.raises(SubsetError, match="no token is counted min_count=31 times or more "
                                        r"\(the most frequent is counted 30 times\)"):
    select(COUNTS, min_count=31, keep=[8])  # would be the EOS-only subset [8]


def test_d2t_t2d_convention_round_trip():
  sub = select(COUNTS, k=5)
  d2t, t2d = sub.d2t, sub.t2d
  draft = np.arange(sub.size)
  np.testing.assert_array_equal(draft + d2t[draft], sub.ids)  # target = draft + d2t[draft]
  assert t2d.sum() == sub.size and t2d[sub.ids].all()
  assert np.all(np.diff(d2t) >= 0)  # ascending ids <=> non-decreasing offsets
  back = VocabSubset.from_d2t(d2t, 10)
  np.testing.assert_array_equal(back.ids, sub.ids)


def test_save_and_load(tmp_path):
  sub = select(COUNTS, k=3, tokenizer_id="qwen2.5:abc", meta={"source": "stdlib"})
  path = sub.save(tmp_path / "drafter" / "vocab_subset.npz")
  again = VocabSubset.load(path, tokenizer_id="qwen2.5:abc")
  np.testing.assert_array_equal(again.ids, sub.ids)
  assert dict(again.meta)["source"] == "stdlib" and again.tokenizer_id == "qwen2.5:abc"
  with pytest.raises(SubsetError, match="counted with tokenizer 'qwen2.5:abc', not 'llama3'"):
    VocabSubset.load(path, tokenizer_id="llama3")
  path.write_bytes(path.read_bytes()[:40])  # truncated
  with pytest.raises(SubsetError, match="truncated or corrupt"):
    VocabSubset.load(path)
  with pytest.raises(SubsetError, match="no vocabulary subset at"):
    VocabSubset.load(tmp_path / "missing.npz")


@pytest.mark.parametrize("kw, message", [
    ({"k": 11}, r"k=11 must be in \[1, vocabulary size 10\]"),
    ({"k": 0}, r"k=0 must be in"),
    ({"k": 1, "keep": [1, 2]}, "smaller than the 2 tokens that must be kept"),
    ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
    ({"top_p": 0.0}, r"top_p=0.0 must be in"),
    ({"k": 2, "top_p": 0.5}, "exactly one of"),
    ({"k": 2, "keep": [10]}, r"keep ids must lie in \[0, 10\)"),
])
def test_bad_selection_names_the_value(kw, message):
  with pytest.raises(SubsetError, match=message):
    select(COUNTS, **kw)


def test_empty_counts_are_rejected():
  with pytest.raises(SubsetError, match="all zero: empty calibration set"):
    select(np.zeros(10, np.int64), k=2)
  with pytest.raises(SubsetError, match="strictly ascending"):
    VocabSubset(ids=np.array([3, 1]), vocab_size=10)
