"""Vocabulary translation (OmniDraft): byte-level and SentencePiece tokens reduced to
bytes, the intersection of two trained vocabularies, special tokens, overlap errors, round trip."""

import numpy as np
import pytest

from vocabjax.testing.tiny import TINY_SPECIAL_TOKENS, tiny_tokenizer
from vocabjax.vocab.translate import (TranslationError, build_vocab_map, check_round_trip,
                                      token_bytes, tokenizer_style)

CORPUS_B = ["The lazy dog sleeps while the quick fox runs.", "def mul(a, b):\n    return a * b\n",
            "Bonjour le monde, comment allez-vous ?", "print('hello world')"] * 20


def sentencepiece_tokenizer(vocab_size=300, corpus=CORPUS_B):
  """A Llama-2-style BPE: Metaspace pre-tokenizer ("▁" = space) with byte fallback."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE(byte_fallback=True))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  specials = TINY_SPECIAL_TOKENS + [f"<0x{b:02X}>" for b in range(256)]
  trainer = trainers.BpeTrainer(vocab_size=vocab_size + 256, special_tokens=specials,
                                show_progress=False)
  tok.train_from_iterator(corpus, trainer)
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                 eos_token="</s>")


def test_token_bytes_of_both_conventions():
  bl = tiny_tokenizer(320)
  sp = sentencepiece_tokenizer()
  assert tokenizer_style(bl) == "byte_level" and tokenizer_style(sp) == "sentencepiece"
  b, special = token_bytes(bl)
  vocab = bl.get_vocab()
  assert b[vocab["Ġ"]] == b" " and b[vocab["Ċ"]] == b"\n"
  assert special[vocab["<|im_end|>"]] and b[vocab["<|im_end|>"]] == b"<|im_end|>"
  s, sspecial = token_bytes(sp)
  svocab = sp.get_vocab()
  assert s[svocab["<0x0A>"]] == b"\n"
  assert s[svocab["▁"]] == b" "
  # every piece decodes to its bytes: a sentence is the concatenation of its tokens' bytes
  for tok, table in ((bl, b), (sp, s)):
    text = "The lazy dog sleeps."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    got = b"".join(table[i] for i in ids).decode()
    assert got.strip() == text


def test_intersection_of_two_trained_vocabularies():
  a = tiny_tokenizer(320)
  b = tiny_tokenizer(400, corpus=CORPUS_B)
  vm = build_vocab_map(a, b)
  ab, _ = token_bytes(a)
  bb, _ = token_bytes(b)
  shared = [(i, int(j)) for i, j in enumerate(vm.d2t) if j >= 0]
  assert shared and all(ab[i] == bb[j] for i, j in shared)  # same text on both sides
  assert all(vm.t2d[j] == i for i, j in shared)
  # all 256 single bytes and the special tokens are in both vocabularies
  o = vm.overlap
  assert o["shared"] >= 256 + len(TINY_SPECIAL_TOKENS)
  assert o["drafter_vocab"] == len(a) and o["target_vocab"] == len(b)
  # unshared multi-byte tokens really are absent from the other side
  bset = set(bb)
  assert all(ab[i] not in bset for i in range(len(a)) if vm.d2t[i] < 0)
  # across conventions: "▁the"-style pieces meet "Ġthe"-style ones on their bytes
  sp = sentencepiece_tokenizer()
  vm2 = build_vocab_map(sp, b, min_overlap=0.05)
  sb, _ = token_bytes(sp)
  assert any(x == b" the" for i, x in enumerate(sb) if vm2.d2t[i] >= 0)


def test_special_tokens_match_only_special_tokens():
  a = tiny_tokenizer(320)
  b = tiny_tokenizer(400, corpus=CORPUS_B + ["<|im_end|> literally"])
  vm = build_vocab_map(a, b)
  ia, ib = a.get_vocab()["<|im_end|>"], b.get_vocab()["<|im_end|>"]
  assert vm.d2t[ia] == ib


def test_too_little_overlap_names_the_numbers():
  a = tiny_tokenizer(320)
  b = tiny_tokenizer(400, corpus=CORPUS_B)
  with pytest.raises(TranslationError, match=rf"shares \d+ of its 320 tokens \(\d+\.\d%\) with "
                                             rf"the target's {len(b)} .*below min_overlap=99%"):
    build_vocab_map(a, b, min_overlap=0.99)


def test_round_trip_check():
  tok = tiny_tokenizer(320)
  assert check_round_trip(tok, ["def add(a, b):\n    return a + b\n", "Hello world!"]) == {
      "texts": 2, "failures": 0}
  sp = sentencepiece_tokenizer()  # strips the leading space: "  x" does not come back
  with pytest.raises(TranslationError, match=r"does not round-trip 1 of 2 texts \(50%\)"):
    check_round_trip(sp, ["Bonjour le monde", "  two leading spaces"], name="sp")


def test_ngram_cache_learns_and_merges_on_a_hand_built_pair():
  from vocabjax.vocab.translate import NgramCache

  class Tok:  # a drafter that spells "hello" as "hel" + "lo" and "world" as "wor" + "ld"
    pieces = {"hello": [5, 6], "world": [7, 8], " ": [1], "a": [2]}

    def __call__(self, text, add_special_tokens=False):
      return {"input_ids": self.pieces[text]}

  # target vocabulary: 0 " ", 1 "a", 2 "hello", 3 "world", 4 "\xe2" (part of a character)
  target_bytes = [b" ", b"a", b"hello", b"world", b"\xe2"]
  d2t = np.array([-1, 0, 1, -1, -1, -1, -1, -1, -1])  # drafter " " -> 0, "a" -> 1
  cache = NgramCache()
  assert cache.learn([2, 0, 3, 4, 2], target_bytes, Tok()) == 2  # repeats and " " add nothing
  assert cache.entries == {(5, 6): 2, (7, 8): 3} and cache.max_len == 2
  q = np.array([0.9, 0.5, 0.8, 0.7, 0.6, 0.4])
  merged = cache.merge([5, 6, 1, 7, 8, 2], q, d2t)
  assert [(t, n) for t, _, n in merged] == [(2, 2), (0, 1), (3, 2), (1, 1)]
  assert merged[0][1] == pytest.approx(0.9 * 0.5) and merged[2][1] == pytest.approx(0.7 * 0.6)
  # an unmapped drafter token that starts no hit ends the run
  assert [t for t, _, _ in cache.merge([2, 5, 3, 1], np.ones(4), d2t)] == [1]
  assert cache.stats == {"entries": 2, "ids": 6, "bytes_int64": 48}
