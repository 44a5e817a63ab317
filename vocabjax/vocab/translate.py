"""Vocabulary translation between two tokenizers (OmniDraft): the direct map, the n-gram cache,
and `Translator` (both directions, used by `vocabjax.decoding.crossvocab` and the distiller).

Letters: Vd drafter vocabulary, V target vocabulary.

Every token is reduced to the bytes it stands for, whatever the tokenizer's convention:
  byte-level BPE (GPT-2, Qwen, SmolLM2, Llama 3): each character of the token string is one
    byte through GPT-2's `bytes_to_unicode` table ("Ġ" = space, "Ċ" = newline);
  SentencePiece (Llama 2, Gemma): "▁" is a space and `<0xNN>` byte-fallback tokens are byte NN;
  anything else: the tokenizer's own decoding of the single token.
Special (added) tokens keep their text and match only special tokens with the same text (the
chat markers `<|im_start|>` / `<|im_end|>` that SmolLM2 and Qwen share).

Two tokens correspond when their bytes are equal: the vocabulary intersection. A drafter token
outside it has no target token of the same text; OmniDraft suppresses it when drafting (the
uniform-alphabet baseline, UAG) or merges runs of such sub-tokens through its n-gram cache.
`VocabMap.overlap` reports the measured sizes; `build_vocab_map(..., min_overlap=)` refuses a
pair that shares too little to be useful, naming the numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import numpy as np


class TranslationError(ValueError):
  """Tokenizers that cannot be bridged (too little overlap, no round trip); names the numbers."""


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
  """GPT-2's byte-level alphabet, inverted: character -> byte."""
  bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1)))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return {chr(c): b for b, c in zip(bs, cs)}


def tokenizer_style(tokenizer) -> str:
  """"byte_level", "sentencepiece" or "other", from the fast tokenizer's decoder."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    return "other"
  decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
  if '"ByteLevel"' in decoder:
    return "byte_level"
  if '"Metaspace"' in decoder or "\\u2581" in decoder or "▁" in decoder:
    return "sentencepiece"
  return "other"


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_bytes(tokenizer) -> tuple[list[bytes | None], np.ndarray]:
  """(bytes each id stands for, or None when it cannot be told; [V] bool: special token)."""
  V = len(tokenizer)
  pieces = tokenizer.convert_ids_to_tokens(list(range(V)))
  special = np.zeros(V, bool)
  for i in getattr(tokenizer, "added_tokens_decoder", {}):
    if i < V:
      special[i] = True
  style = tokenizer_style(tokenizer)
  table = _byte_decoder()
  out: list[bytes | None] = []
  for i, piece in enumerate(pieces):
    m = _BYTE_TOKEN.match(piece) if style == "sentencepiece" and piece else None
    if piece is None:
      out.append(None)
    elif m:  # byte fallback, even when registered as an added token
      out.append(bytes([int(m.group(1), 16)]))
      special[i] = False
    elif special[i]:
      out.append(piece.encode())
    elif style == "byte_level":
      try:
        out.append(bytes(table[ch] for ch in piece))
      except KeyError:  # a character outside the byte alphabet: not a byte-level piece
        out.append(piece.encode())
    elif style == "sentencepiece":
      out.append(piece.replace("▁", " ").encode())
    else:
      out.append(tokenizer.decode([i]).encode())
  return out, special


@dataclasses.dataclass(frozen=True)
class VocabMap:
  """The direct mapping of a drafter vocabulary into a target vocabulary."""

  d2t: np.ndarray  # [Vd] int64 target id of each drafter id, -1 outside the intersection
  t2d: np.ndarray  # [V] int64 drafter id of each target id, -1 outside the intersection
  draft_style: str
  target_style: str

  @property
  def overlap(self) -> dict:
    n = int((self.d2t >= 0).sum())
    return {"shared": n, "drafter_vocab": int(self.d2t.size), "target_vocab": int(self.t2d.size),
            "share_of_drafter": n / max(self.d2t.size, 1),
            "share_of_target": n / max(self.t2d.size, 1)}


def build_vocab_map(draft_tokenizer, target_tokenizer, *, min_overlap: float = 0.1) -> VocabMap:
  """Match the two vocabularies on token bytes (module doc). TranslationError when fewer than
  `min_overlap` of the drafter's tokens have a target token of the same text."""
  d_bytes, d_special = token_bytes(draft_tokenizer)
  t_bytes, t_special = token_bytes(target_tokenizer)
  index = {}
  for j, (b, s) in enumerate(zip(t_bytes, t_special)):
    if b is not None:
      index.setdefault((b, bool(s)), j)  # duplicates: the lowest id wins
  d2t = np.full(len(d_bytes), -1, np.int64)
  t2d = np.full(len(t_bytes), -1, np.int64)
  for i, (b, s) in enumerate(zip(d_bytes, d_special)):
    j = index.get((b, bool(s))) if b is not None else None
    if j is not None and t2d[j] < 0:
      d2t[i], t2d[j] = j, i
  vm = VocabMap(d2t, t2d, tokenizer_style(draft_tokenizer), tokenizer_style(target_tokenizer))
  o = vm.overlap
  if o["share_of_drafter"] < min_overlap:
    raise TranslationError(
        f"the drafter's vocabulary shares {o['shared']} of its {o['drafter_vocab']} tokens "
        f"({o['share_of_drafter']:.1%}) with the target's {o['target_vocab']} "
        f"({o['share_of_target']:.1%} of it), below min_overlap={min_overlap:.0%}: too little "
        f"to draft with ({vm.draft_style} vs {vm.target_style} tokenizers)")
  return vm


def check_round_trip(tokenizer, texts, *, name: str = "tokenizer") -> dict:
  """Encode and decode each text; TranslationError naming the first failure and the failure
  rate when any text does not come back unchanged (reverse translation relies on it)."""
  bad = []
  for t in texts:
    ids = tokenizer(t, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back != t:
      bad.append((t, back))
  if bad:
    t, back = bad[0]
    raise TranslationError(f"{name} does not round-trip {len(bad)} of {len(texts)} texts "
                           f"({len(bad) / len(texts):.0%}); first: {t[:60]!r} -> {back[:60]!r}")
  return {"texts": len(texts), "failures": 0}


@dataclasses.dataclass
class NgramCache:
  """OmniDraft's n-gram cache: a drafter token sequence (two or more tokens) -> the target
  token of the same text. Filled online from the reverse translation of accepted target tokens
  (`learn`); `merge` turns a drafted run of drafter tokens into target tokens, merging runs that
  hit the cache (q' = the product of the sub-tokens' q, OmniDraft eq. 1; the prefix adjustment
  of eq. 2 belongs to the decoder and is not here)."""

  entries: dict = dataclasses.field(default_factory=dict)  # tuple of drafter ids -> target id
  max_len: int = 0  # longest key

  def add(self, target_id: int, drafter_ids) -> bool:
    key = tuple(int(i) for i in drafter_ids)
    if len(key) < 2 or key in self.entries:
      return False
    self.entries[key] = int(target_id)
    self.max_len = max(self.max_len, len(key))
    return True

  def learn(self, target_ids, target_bytes, draft_tokenizer) -> int:
    """Reverse-translate target tokens (detokenize one token, retokenize with the drafter) and
    cache those the drafter spells with several tokens; returns how many were new. Tokens whose
    bytes are not whole UTF-8 text (part of a character) are skipped."""
    new = 0
    for t in target_ids:
      b = target_bytes[int(t)]
      if b is None:
        continue
      try:
        text = b.decode()
      except UnicodeDecodeError:
        continue
      ids = draft_tokenizer(text, add_special_tokens=False)["input_ids"]
      new += self.add(int(t), ids)
    return new

  def merge(self, drafter_ids, q, d2t) -> list[tuple[int, float, int]]:
    """Target tokens of a drafted run: (target id, q', sub-tokens used) from the left, the
    longest cache hit first, else the direct mapping; the run ends at the first drafter token
    that neither maps nor starts a hit (the translator suppresses it)."""
    ids = [int(i) for i in drafter_ids]
    out, i = [], 0
    while i < len(ids):
      for n in range(min(self.max_len, len(ids) - i), 1, -1):
        t = self.entries.get(tuple(ids[i:i + n]))
        if t is not None:
          out.append((t, float(np.prod(q[i:i + n])), n))
          i += n
          break
      else:
        if d2t[ids[i]] < 0:
          break
        out.append((int(d2t[ids[i]]), float(q[i]), 1))
        i += 1
    return out

  @property
  def stats(self) -> dict:
    """Entries and an estimate of their memory (OmniDraft table 4): int64 ids, keys + values."""
    ids = sum(len(k) + 1 for k in self.entries)
    return {"entries": len(self.entries), "ids": ids, "bytes_int64": 8 * ids}


class Translator:
  """Both directions between a target and a drafter tokenizer (OmniDraft's translator).

  `d2t` / `t2d` are the direct map padded to the models' vocabulary sizes (rows past a
  tokenizer's length map to -1). Reverse translation (`to_drafter`) spells each target token
  on its own: the direct map when it has one, else its text retokenized by the drafter (cached
  per id); bytes that are not whole UTF-8 text (part of a character) go through the drafter's
  single-byte tokens. `prompt_to_drafter` retokenizes a whole prompt's text at once.
  """

  def __init__(self, target_tokenizer, draft_tokenizer, *, vocab_map: VocabMap | None = None,
               min_overlap: float = 0.1, target_vocab: int | None = None,
               draft_vocab: int | None = None):
    self.vm = vocab_map or build_vocab_map(draft_tokenizer, target_tokenizer,
                                           min_overlap=min_overlap)
    Vd = draft_vocab or self.vm.d2t.size
    V = target_vocab or self.vm.t2d.size
    d2t, t2d = self.vm.d2t[:Vd].copy(), self.vm.t2d[:V].copy()
    d2t[d2t >= V] = -1  # a pair whose id lies past a model's rows is not a pair
    t2d[t2d >= Vd] = -1
    self.d2t = np.pad(d2t, (0, Vd - d2t.size), constant_values=-1)
    self.t2d = np.pad(t2d, (0, V - t2d.size), constant_values=-1)
    self.t_bytes, self.t_special = token_bytes(target_tokenizer)
    d_bytes, _ = token_bytes(draft_tokenizer)
    self.byte_token: dict[int, int] = {}  # single byte -> drafter id
    for i, b in enumerate(d_bytes):
      if b is not None and len(b) == 1:
        self.byte_token.setdefault(b[0], i)
    self.ttok, self.dtok = target_tokenizer, draft_tokenizer
    self._retok: dict[int, tuple[int, ...]] = {}

  def intersection(self) -> tuple[np.ndarray, np.ndarray]:
    """(drafter ids, target ids) of the shared tokens, paired, in drafter-id order."""
    d = np.flatnonzero(self.d2t >= 0)
    return d, self.d2t[d]

  def to_drafter(self, target_ids) -> list[int]:
    """Reverse translation: the drafter ids of target tokens, one token at a time."""
    out: list[int] = []
    for t in target_ids:
      t = int(t)
      ids = self._retok.get(t)
      if ids is None:
        ids = self._retok[t] = self._retokenize(t)
      out.extend(ids)
    return out

  def _retokenize(self, t: int) -> tuple[int, ...]:
    if self.t2d[t] >= 0:
      return (int(self.t2d[t]),)
    b = self.t_bytes[t] if t < len(self.t_bytes) else None
    if b is None:
      raise TranslationError(f"target token {t} has no text to translate for the drafter")
    try:
      text = b.decode()
    except UnicodeDecodeError:  # part of a character: spell it with single-byte tokens
      missing = [x for x in b if x not in self.byte_token]
      if missing:
        raise TranslationError(f"target token {t} holds bytes {bytes(missing)!r} the drafter "
                               f"has no single-byte token for") from None
      return tuple(self.byte_token[x] for x in b)
    return tuple(self.dtok(text, add_special_tokens=False)["input_ids"])

  def prompt_to_drafter(self, prompt) -> list[int]:
    """The drafter's tokens of a target prompt: its text retokenized as a whole."""
    raw = b"".join(self.t_bytes[int(t)] or b"" for t in prompt)
    ids = self.dtok(raw.decode(errors="replace"), add_special_tokens=False)["input_ids"]
    if not ids:
      raise TranslationError(f"the drafter's tokenizer gives no tokens for the prompt {raw!r}")
    return ids
