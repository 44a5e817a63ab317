"""Hand-checkable draft/target pairs built directly as params (no torch needed).

`successor_pair`: a target that always continues t -> t + 1 (mod V) and a drafter that does the
same except after tokens divisible by `skip` (t -> t + 2). Attention and MLP outputs are zeroed
(wo = 0, w_down = 0), so the hidden state is the normed one-hot embedding of the current token
and the LM head is a lookup table: acceptance can be worked out by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import init_params
from vocabjax.testing.tiny import tiny_tokenizer
from vocabjax.vocab.translate import Translator


def lookup_model(config: LlamaLikeConfig, next_token, scale: float = 10.0) -> dict:
  V = config.vocab_size
  params = init_params(jax.random.key(0), config)
  params["embed"] = jnp.eye(V, config.hidden_size, dtype=jnp.float32)
  head = np.zeros((V, config.hidden_size), np.float32)
  for t in range(V):
    head[next_token(t) % V, t] += scale
  params["lm_head"] = jnp.asarray(head)
  for layer in params["layers"]:
    layer["wo"] = jnp.zeros_like(layer["wo"])
    layer["w_down"] = jnp.zeros_like(layer["w_down"])
  return params


def successor_pair(vocab_size: int = 12, skip: int = 3):
  """(config, target_params, draft_params) of the successor fixture; skip=0: drafter = target."""
  config = LlamaLikeConfig(arch="llama", vocab_size=vocab_size, hidden_size=vocab_size,
                           intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                           head_dim=4, max_position_embeddings=1024)
  target = lookup_model(config, lambda t: t + 1)
  draft = lookup_model(config, lambda t: t + 2 if skip and t % skip == 0 else t + 1)
  return config, target, draft


def bigram_model(config: LlamaLikeConfig, logits: np.ndarray) -> dict:
  """A model whose next-token logits after token t are `logits[t]` ([V, V]), whatever came
  before (the `lookup_model` construction with a full table: hidden_size must equal V; the
  normed one-hot hidden state is sqrt(V) x one-hot, so the head is scaled down by it)."""
  V = config.vocab_size
  if config.hidden_size != V or np.shape(logits) != (V, V):
    raise ValueError(f"bigram_model needs hidden_size == V == the table's sides, got "
                     f"hidden_size={config.hidden_size}, V={V}, table {np.shape(logits)}")
  params = lookup_model(config, lambda t: t, scale=0.0)
  params["lm_head"] = jnp.asarray(np.asarray(logits, np.float32).T / np.sqrt(V))
  return params


def merging_pair(seed: int = 0, pool_size: int = 40, candidates: int = 6):
  """A target and a drafter with different tokenizers built so that drafts merge often
  (the cross-vocabulary sampling tests).

  Target: a byte-level BPE of ~380 tokens; drafter: one of 270 trained on other text, so most
  target tokens are spelled by several drafter tokens. The target is a bigram model whose
  next token is one of `candidates` tokens (random logits, everything else impossible) drawn
  from a pool of target tokens the drafter spells with 2 or 3 tokens; the same candidates after
  every token, with logits that vary a little by token. The drafter is a bigram model that has
  learned those spellings from text sampled from the target: its transitions are the counts of
  consecutive sub-tokens in spelled target text (blurred where spellings share sub-tokens),
  plus noise.
  Returns (target tokenizer, drafter tokenizer, target config, drafter config, target params,
  drafter params, pool of target ids).
  """
  corpus = ["Bonjour le monde, comment allez-vous ?", "print('hello world')",
            "La vie est belle.", "x = [i * i for i in range(5)]"] * 20
  ttok, dtok = tiny_tokenizer(400), tiny_tokenizer(270, corpus=corpus)
  V, Vd = len(ttok), len(dtok)
  cfg = lambda n: LlamaLikeConfig(arch="llama", vocab_size=n, hidden_size=n,  # noqa: E731
                                  intermediate_size=8, num_layers=1, num_heads=2,
                                  num_kv_heads=1, head_dim=4, max_position_embeddings=1024)
  tc, dc = cfg(V), cfg(Vd)
  tr = Translator(ttok, dtok)
  rng = np.random.default_rng(seed)
  spell = {}
  for t in range(3, V):
    try:
      spell[t] = tr.to_drafter([t])
    except ValueError:
      continue
  multi = sorted(t for t, s in spell.items() if 2 <= len(s) <= 3 and tr.t_bytes[t].isascii())
  pool = [int(t) for t in rng.choice(multi, size=min(pool_size, len(multi)), replace=False)]
  cand = np.asarray(pool[:candidates])
  base = rng.normal(0.0, 1.0, candidates)
  table = np.full((V, V), -1e4, np.float32)
  table[:, cand] = base + rng.normal(0.0, 0.3, (V, candidates))
  mass = np.zeros((Vd, Vd))
  for t in cand:  # spelled text sampled from the target: the sub-token bigrams it contains
    row = np.exp(table[t] - table[t].max())
    row /= row.sum()
    for x in cand:
      s = list(spell[int(t)]) + list(spell[int(x)])
      for a, b in zip(s, s[1:]):
        mass[a, b] += row[x]
  dtable = np.log(mass / np.maximum(mass.sum(1, keepdims=True), 1e-9) + 1e-4)
  dtable += rng.normal(0.0, 0.3, dtable.shape)
  return ttok, dtok, tc, dc, bigram_model(tc, table), bigram_model(dc, dtable), pool
