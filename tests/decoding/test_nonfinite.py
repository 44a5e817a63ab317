"""A NaN or an infinity in a decoding step's target logits is an error naming the row and the
step, never a silent stream of token 0 (every decoder: the flag is set where the target's
logits are verified or sampled, and raised by the host loop)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG
from vocabjax.decoding import NonFiniteLogitsError
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.sampling import NONFINITE, SamplingParams, flag_nonfinite
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams

GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
PROMPTS = [[5, 9, 2, 7, 5, 9, 2], [1, 2, 3, 4]]


def test_flag_marks_only_rows_with_nonfinite_values():
  x = jnp.ones((3, 4, 5)).at[1, 2, 3].set(jnp.nan).at[2, 0, 0].set(jnp.inf)
  assert flag_nonfinite(jnp.array([7, 8, 9]), x).tolist() == [7, NONFINITE, NONFINITE]
  assert flag_nonfinite(jnp.array([7, 8]), jnp.full((2, 3), -1e30)).tolist() == [7, 8]


def _decoder(kind, target, draft):
  if kind == "ar":
    return Decoder(target, CFG)
  if kind == "chain":
    return SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2))
  if kind == "tree":
    return SpeculativeEngine(target, CFG, TreeProposer(draft, CFG, CFG, tree=TreeParams(2, 2, 3)))
  return SpeculativeEngine(target, CFG, LookupProposer(gamma=2))


def _poisoned(params, token: int, value=jnp.nan):
  """params whose embedding row of `token` is `value`: a row whose context holds the token gets
  non-finite logits from then on, the other rows stay finite."""
  out = dict(params)
  out["embed"] = params["embed"].at[token].set(value)
  return out


@pytest.mark.parametrize("kind,sampling", [("ar", GREEDY), ("ar", SAMPLED), ("chain", GREEDY)])
def test_nan_in_a_prompt_token_is_an_error_naming_the_row(pair, kind, sampling):
  """The prefill's flag (`sample`, greedy and sampled; every decoder prefills through it), raised
  by the plain and the speculative host loops."""
  target, draft = pair
  bad = _poisoned(target, 3)  # only the second prompt holds token 3
  with pytest.raises(NonFiniteLogitsError, match=r"prefill hold NaN or inf \(row 1, generated "
                                                 r"token 0\)"):
    _decoder(kind, bad, draft).generate(PROMPTS, max_new_tokens=4, sampling=sampling)


@pytest.mark.extended(params=["chain-sampling2", "tree-sampling4", "pld-sampling5"])
@pytest.mark.parametrize("kind,sampling", [("ar", GREEDY), ("chain", GREEDY),
                                           ("chain", SAMPLED), ("tree", GREEDY),
                                           ("tree", SAMPLED), ("pld", GREEDY)])
def test_inf_reached_while_decoding_is_an_error_naming_the_step(pair, kind, sampling):
  """The clean model's greedy output, then the first generated token that is new to row 0
  poisoned with +inf: the step that feeds it raises (nothing after it is emitted as a token).
  Each verifier's flag: chain greedy / sampled, tree greedy / sampled, lookup, plain steps.
  Sampled rows are greedy-like here (temperature 1e-3) so the poisoned token is reached."""
  target, draft = pair
  clean = Decoder(target, CFG).generate(PROMPTS[:1], max_new_tokens=10).tokens[0]
  seen = set(PROMPTS[0])
  pos = next(i for i, t in enumerate(clean) if t not in seen and t not in clean[:i])
  assert pos < 8, clean
  sp = GREEDY if sampling.greedy else SamplingParams(temperature=1e-3)
  with pytest.raises(NonFiniteLogitsError, match=rf"row 0, generated token {pos + 1}\)"):
    _decoder(kind, _poisoned(target, clean[pos], jnp.inf), draft).generate(
        PROMPTS[:1], max_new_tokens=10, sampling=sp)


def test_finite_models_are_unaffected(pair):
  """Large but finite logits are not flagged (the greedy output equals plain decoding's)."""
  target, draft = pair
  big = dict(target, final_norm=target["final_norm"] * 1e3)
  ar = Decoder(big, CFG).generate(PROMPTS, max_new_tokens=8)
  res = SpeculativeEngine(big, CFG, ChainProposer(draft, CFG, CFG,
                                                  gamma=2)).generate(PROMPTS, max_new_tokens=8)
  assert res.tokens == ar.tokens
  assert np.all(np.asarray(sum(ar.tokens, [])) >= 0)
