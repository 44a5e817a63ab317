"""A prompt block longer than `PROMPT_CHUNK` prefills in chunks (the first chunk's program, shared
with a one-chunk prompt, then one program per size of the next chunks), with the values of one
block's prefill, and every decoder over the target still gives plain decoding's tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder
from vocabjax.decoding import autoregressive
from vocabjax.decoding.autoregressive import (chunk_sizes, chunks_prompt, lower_target_prefill,
                                              target_prefill_program)
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.engine import PROGRAMS, DecoderPrograms
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.lowering import Lowering
from vocabjax.models import KVCache, init_params
from vocabjax.sampling import SamplingParams

from tests.helpers.heads import random_head
from tests.helpers.models import CFG

PROMPT_CHUNK = 256  # the tests' chunk (the users': `autoregressive.PROMPT_CHUNK`)
LENGTHS = (2 * PROMPT_CHUNK + 40, PROMPT_CHUNK + 12, 60)  # rows ending in chunks 3, 2 and 1


@pytest.fixture(autouse=True)
def _chunk(monkeypatch):
  monkeypatch.setattr(autoregressive, "PROMPT_CHUNK", PROMPT_CHUNK)


def _block(lengths, T):
  rs = np.random.RandomState(1)
  tokens = np.zeros((len(lengths), T), np.int32)
  for b, n in enumerate(lengths):
    tokens[b, :n] = rs.randint(0, CFG.vocab_size, n)
  return tokens


@pytest.mark.parametrize("features", [(), (0, 1)], ids=["plain", "features"])
def test_a_long_block_prefills_in_chunks_with_one_blocks_values(target, features):
  T, S = 2 * PROMPT_CHUNK + 128, 4 * PROMPT_CHUNK  # chunks of C, C and 128 tokens
  assert chunks_prompt(T, CFG, S, None)
  assert not chunks_prompt(PROMPT_CHUNK, CFG, S, None)
  assert chunk_sizes(T) == [PROMPT_CHUNK, PROMPT_CHUNK, 128]
  lengths = np.asarray(LENGTHS, np.int32)
  tokens, B = _block(LENGTHS, T), len(LENGTHS)
  sampling, key = SamplingParams(), jax.random.key(7)
  progs = DecoderPrograms(lambda: "chunk-test")
  chunked, _ = target_prefill_program(progs, target, CFG, sampling, B, T, S, jnp.float32,
                                      lowering=Lowering(), feature_layers=features)
  one = lower_target_prefill(target, CFG, sampling, B, T, S, jnp.float32, lowering=Lowering(),
                             feature_layers=features).compile()
  new = lambda: KVCache.init(CFG, B, S)  # noqa: E731
  got = chunked(target, jnp.asarray(tokens), jnp.asarray(lengths), new(), key)
  want = one(target, jnp.asarray(tokens), jnp.asarray(lengths), new(), key)
  assert np.array_equal(got[0], want[0])  # the first tokens
  np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-4)  # each row's last hidden
  assert np.array_equal(got[1].lengths, lengths)
  for b, n in enumerate(LENGTHS):  # every row's prompt entries (padding past them is unread)
    np.testing.assert_allclose(got[1].k[:, b, :n], want[1].k[:, b, :n], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1].v[:, b, :n], want[1].v[:, b, :n], rtol=1e-4, atol=1e-4)
  if features:
    assert got[3].shape == want[3].shape == (B, T, len(features) * CFG.hidden_size)
    for b, n in enumerate(LENGTHS):
      np.testing.assert_allclose(got[3][b, :n], want[3][b, :n], rtol=1e-4, atol=1e-4)
  else:
    assert got[3] is None and want[3] is None
  shapes = {k.shapes[1] for (k, _, _) in PROGRAMS._table
            if k.program in ("target_prefill", "target_prefill_more")
            and k.method[1] == CFG and k.shapes[2] == S}
  assert shapes == {PROMPT_CHUNK, 128}  # no program of the whole block


def test_every_decoder_over_the_target_gives_plain_decodings_tokens(target):
  """Plain decoding, a chain drafter and an EAGLE head (the features path) over prompts of
  one, two and three chunks, alone and as one batch: token for token."""
  prompts = [_block((n,), n)[0].tolist() for n in LENGTHS]
  draft = init_params(jax.random.key(4), CFG, scale=0.3)
  hc, head = random_head(target, CFG)
  kw = dict(max_new_tokens=12, max_len=4 * PROMPT_CHUNK)
  ar = Decoder(target, CFG)
  want = [ar.generate([p], **kw).tokens[0] for p in prompts]
  want_batch = ar.generate(prompts, **kw).tokens
  assert want_batch == want  # rows ending in different chunks: each as alone
  for P in (ChainProposer(draft, CFG, CFG, gamma=3),
            EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 2, 4))):
    eng = SpeculativeEngine(target, CFG, P)
    assert [eng.generate([p], **kw).tokens[0] for p in prompts] == want
    assert eng.generate(prompts, **kw).tokens == want
