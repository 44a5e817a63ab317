"""Continuous batching on the speculative engine (`SpeculativeEngine.generate_continuous`, one
`engine.continuous_loop` with plain decoding's): every kind of proposer state handed from one
prompt to the next (a drafter's cache, an EAGLE head's features, Medusa's hidden state, a host
hook's trees) keeps plain greedy tokens; sampled output keeps the target's law; what cannot run
so says why; calls from two threads run one after another."""

import jax
import numpy as np
import pytest

from tests.helpers.models import CFG, PROMPT, SMALL
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

# prompts of four length buckets; rows < prompts, so rows are handed over mid-run
PROMPTS = [[5, 9, 2, 7, 5, 9], [1, 2, 3], [8] * 19, [4], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]


def _decoder(kind, target, draft):
  if kind == "chain":
    return SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3))
  if kind == "tree":
    return SpeculativeEngine(target, CFG, TreeProposer(draft, CFG, CFG, tree=TreeParams(2, 2, 4)))
  if kind == "eagle":
    from tests.helpers.heads import random_head
    from vocabjax.decoding.eagle import EagleProposer

    hc, head = random_head(target, CFG, 40)
    return SpeculativeEngine(target, CFG,
                             EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 2, 4)))
  if kind == "medusa":
    from tests.helpers.heads import SPARSE, heads_for
    from vocabjax.decoding.medusa import MedusaProposer

    heads, mc = heads_for(target, CFG)
    return SpeculativeEngine(target, CFG, MedusaProposer(target, CFG, heads, mc, choices=SPARSE))
  if kind == "pld":
    from vocabjax.decoding.pld import LookupProposer

    return SpeculativeEngine(target, CFG, LookupProposer(gamma=3))
  if kind == "eagle_suffix":  # the suffix trees (per-row requests on the host) + a head's tree
    from tests.helpers.heads import random_head
    from vocabjax.decoding.eagle import EagleProposer
    from vocabjax.decoding.hybrid import HostTreeHybrid, SuffixTrees
    from vocabjax.decoding.suffix import SuffixProposer

    hc, head = random_head(target, CFG, 40)
    return SpeculativeEngine(
        target, CFG,
        HostTreeHybrid(EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 2, 4)),
                       SuffixTrees(SuffixProposer(max_spec_tokens=6))))
  raise ValueError(kind)


@pytest.mark.extended(params=["chain", "eagle_suffix", "pld", "medusa"])
@pytest.mark.parametrize("kind", ["chain", "tree", "eagle", "medusa", "pld", "eagle_suffix"])
def test_rows_handed_to_the_next_prompt_keep_plain_greedy_tokens(pair, kind):
  """Two rows decode six prompts: each prompt's tokens and finish reason are plain decoding's
  (an EOS token ends some early, so rows take new prompts at different steps); the stats are
  laid out over the two rows. The suffix hybrid's trees learn from the prompts that ended: the
  same prompts again draft more from them."""
  target, draft = pair
  ar = Decoder(target, CFG).generate(PROMPTS, max_new_tokens=20)
  eos = [ar.tokens[0][1], ar.tokens[3][7]]  # tokens the outputs hold: some rows end early
  want = Decoder(target, CFG).generate(PROMPTS, max_new_tokens=20, eos_token_ids=eos)
  assert len({len(t) for t in want.tokens}) > 2  # answers of different lengths
  dec = _decoder(kind, target, draft)
  res = dec.generate_continuous(PROMPTS, rows=2, max_new_tokens=20, eos_token_ids=eos)
  assert res.tokens == want.tokens and res.finish_reasons == want.finish_reasons
  assert res.prompt_lengths == [len(p) for p in PROMPTS]
  st = res.stats
  assert {len(r) for r in st.drafted} == {2} and len(st.drafted) == res.steps
  # the stats count the rows' steps: each keeps a token or more of its row's prompt, and at
  # most its accepted drafts + 1 (a prompt's last step may emit past its end)
  kept = sum(len(t) - 1 for t in res.tokens)
  assert st.num_steps <= kept <= sum(map(sum, st.accepted)) + st.num_steps
  # per prompt (`per_prompt`: the rows' counts by the prompt each row held): the same bounds,
  # and a chain's deterministic drafts give each prompt the counts it gets alone (a one-row
  # prefill either way; a batch's padded prompt block may prefill the drafter in bf16)
  steps, acc = st.per_prompt("steps"), st.per_prompt("accepted")
  assert sum(steps) == st.num_steps and sum(acc) == sum(map(sum, st.accepted))
  for t, s, a in zip(res.tokens, steps, acc):
    assert s <= len(t) - 1 <= a + s
  if kind == "chain":
    alone = [dec.generate([p], max_new_tokens=20, eos_token_ids=eos).stats for p in PROMPTS]
    assert acc == [sum(map(sum, s.accepted)) for s in alone]
    assert steps == [s.num_steps for s in alone]
    # every prompt done at its first token: no step, and still one count per prompt
    first = dec.generate_continuous(PROMPTS, rows=2, max_new_tokens=1).stats
    assert first.per_prompt("steps") == [0] * len(PROMPTS)
  if kind == "eagle_suffix":
    again = dec.generate_continuous(PROMPTS, rows=2, max_new_tokens=20, eos_token_ids=eos)
    assert again.tokens == want.tokens
    assert again.stats.record()["accepted_from_suffix"] > res.stats.record()[
        "accepted_from_suffix"]


@pytest.mark.extended
def test_sampled_output_keeps_the_targets_law():
  """6,000 rows of one prompt through 500 cache rows (each row decodes about 12 prompts in turn,
  each prompt's first token from its own one-row prefill): the joint law of the first three
  tokens is the target's (chi-square), with drafts both accepted and rejected."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  draft = init_params(jax.random.key(11), SMALL, scale=0.8)
  dec = SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=2))
  sampling = SamplingParams(temperature=1.0)
  res = dec.generate_continuous([PROMPT] * 6000, rows=500, max_new_tokens=3, sampling=sampling,
                                seed=3)
  toks = np.asarray([t[:3] for t in res.tokens])
  V = SMALL.vocab_size
  cells = toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2]
  assert 0.05 < res.stats.acceptance_rate < 0.95
  assert chi2_pvalue(cells, exact_sequence_probs(target, SMALL, PROMPT, sampling)) > 1e-3


def test_what_cannot_batch_continuously_says_why(pair):
  """A host drafter that does not say it hands rows over (no `RowHandover`: every registered
  method does, the TPU matrix test checks) is refused naming the method, as is a bad row
  count."""
  from vocabjax.decoding.proposer import HostDrafter

  class Held(HostDrafter):  # a host drafter that does not say it can hand rows over
    method = "held"

    def host_block(self, history, active):
      raise AssertionError("never called")

    def key(self):
      return ("held",)

    def prefill(self, params, target_params, pre):
      return ()

    def propose(self, params, state, ctx, key, *, sampling, keep=None):
      raise AssertionError("never traced")

    def commit(self, params, state, ctx, drafts, verdict):
      return state

  target, _ = pair
  dec = SpeculativeEngine(target, CFG, Held())
  with pytest.raises(ValueError, match="continuous batching: held's proposer \\(Held\\) keeps "
                                       "per-row host state"):
    dec.generate_continuous(PROMPTS, rows=2, max_new_tokens=4)
  with pytest.raises(ValueError, match="rows=0 must be >= 1"):
    SpeculativeEngine(target, CFG, ChainProposer(target, CFG, CFG, gamma=2)).generate_continuous(
        PROMPTS, rows=0, max_new_tokens=4)


def test_calls_from_two_threads_run_one_after_another():
  """Two threads on one SuffixDecoding engine (its host hook keeps a call's rows): the second
  call, started while the first one waits in its streamer, begins only once the first has
  ended, and each gets plain greedy tokens."""
  import threading
  import time

  from vocabjax.decoding.suffix import SuffixProposer

  events = []

  class Logged(SuffixProposer):
    def host_begin(self, history):
      events.append((threading.current_thread().name, "begin"))
      super().host_begin(history)

    def host_end(self, history):
      events.append((threading.current_thread().name, "end"))
      super().host_end(history)

  in_put, second_started = threading.Event(), threading.Event()

  class Held:  # transformers' streamer protocol: the prompt first, then the kept tokens
    def put(self, ids):
      if not second_started.is_set():
        in_put.set()
        second_started.wait(10)
        time.sleep(0.5)  # the second call (its programs compiled) would begin now, let in

    def end(self):
      pass

  params = init_params(jax.random.key(0), CFG, scale=0.3)
  dec = SpeculativeEngine(params, CFG, Logged(max_spec_tokens=4))
  want = Decoder(params, CFG).generate(PROMPTS[:2], max_new_tokens=12).tokens
  assert dec.generate(PROMPTS[:2], max_new_tokens=12).tokens == want  # the second's programs
  events.clear()
  got = {}
  a = threading.Thread(name="a", target=lambda: got.update(a=dec.generate(
      [PROMPTS[0]], max_new_tokens=12, streamer=Held()).tokens))
  b = threading.Thread(name="b", target=lambda: got.update(b=dec.generate(
      PROMPTS[:2], max_new_tokens=12).tokens))
  a.start()
  assert in_put.wait(60)  # the first call is in its streamer's first put (the prompt)
  b.start()
  second_started.set()
  a.join(60)
  b.join(60)
  assert events == [("a", "begin"), ("a", "end"), ("b", "begin"), ("b", "end")]
  assert got == {"a": want[:1], "b": want}


def test_a_model_parallel_mesh_decodes_continuously(pair):
  """On a (1, 2) mesh (heads and MLP split over two devices, no data axis) plain decoding and a
  chain drafter batch continuously with plain greedy tokens (the compiled step takes the rows'
  state only with the shardings it was compiled for: a hand-over must keep them); a mesh with
  a data axis is refused (one prompt is prefilled at a time)."""
  from vocabjax import sharding

  target, draft = pair
  want = Decoder(target, CFG).generate(PROMPTS, max_new_tokens=16).tokens
  mesh = sharding.make_mesh(data=1, model=2, devices=jax.devices()[:2])
  plain = Decoder(target, CFG, mesh=mesh).generate_continuous(PROMPTS, rows=2,
                                                              max_new_tokens=16)
  assert plain.tokens == want
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3), mesh=mesh)
  assert dec.generate_continuous(PROMPTS, rows=2, max_new_tokens=16).tokens == want
  data = sharding.make_mesh(data=2, model=1, devices=jax.devices()[:2])
  with pytest.raises(ValueError, match="not one of data=2; use generate"):
    SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3),
                      mesh=data).generate_continuous(PROMPTS, rows=2, max_new_tokens=4)
