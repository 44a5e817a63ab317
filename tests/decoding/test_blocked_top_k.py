"""Decoders with the two-stage drafting top-k (`Lowering.block_top_k`, what their TPU steps
use) draft the same trees and keep plain decoding's tokens: a tree drafter, an EAGLE head, and
SpecVocab's ranker over 320-token vocabularies cut in blocks of 64."""

import pytest

from tests.helpers.heads import eagle2_config, eagle2_params
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import TreeProposer
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model(tiny_chat_dir):
  return load_model(tiny_chat_dir, dtype="float32")


def _blocked(dec, block=64):
  dec.lowering = dec.lowering.replace(block_top_k=block)
  return dec


def test_tree_and_eagle_with_blocked_top_k_keep_plain_tokens(model, monkeypatch):
  from vocabjax import sampling

  calls = []
  real = sampling.blocked_top_k
  monkeypatch.setattr(sampling, "blocked_top_k",
                      lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
  ids = [model.tokenizer(t)["input_ids"] for t in ("def add(a, b):", "The quick brown")]
  ar = Decoder(model.params, model.config).generate(ids, max_new_tokens=10, sampling=GREEDY)
  tree = TreeParams(top_k=4, depth=3, total_tokens=10)
  hc = eagle2_config(model.config)
  head = eagle2_params(hc, seed=4)
  makers = {
      "tree":
          lambda: SpeculativeEngine(
              model.params, model.config,
              TreeProposer(model.params, model.config, model.config, tree=tree)),
      "eagle":
          lambda: SpeculativeEngine(model.params, model.config,
                                    EagleProposer(model.params, model.config, head, hc, tree=tree))
  }
  for name, make in makers.items():
    plain = make().generate(ids, max_new_tokens=10, sampling=GREEDY)
    dec = _blocked(make())  # set before its programs are built (they are cached per decoder)
    blocked = dec.generate(ids, max_new_tokens=10, sampling=GREEDY)
    assert blocked.tokens == ar.tokens == plain.tokens, name
    # the same drafts: the same acceptance, step by step
    assert blocked.stats.accepted == plain.stats.accepted, name
    assert dec.lowering.block_top_k == 64 and calls  # traced through the two-stage form
    calls.clear()
