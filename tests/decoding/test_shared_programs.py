"""Programs shared across the process's decoders (`engine.PROGRAMS`): a decoder built
again for the same models, method and shapes takes the first one's compiled programs, and
gives its own params' tokens; anything its programs would be built differently for (another
method setting, weight dtype, model config, mesh) builds its own."""

import dataclasses

import jax
import pytest

from vocabjax.decoding import engine
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models.llamalike import cast_weights
from vocabjax.testing.proposers import greedy_identity

from tests.helpers.models import CFG

PROMPTS = [[3, 1, 4, 1, 5], [9, 2]]


@pytest.fixture
def table():
  """The process's program cache, emptied for the test (and after it), its hit count from 0."""
  t = engine.PROGRAMS
  held = (t.enabled, t.check)
  t.clear()
  t.hits = 0
  yield t
  t.enabled, t.check = held
  t.clear()


def _run(dec, **kw):
  return dec.generate(PROMPTS, max_new_tokens=6, **kw)


def test_plain_decoders_of_one_model_share_programs_and_keep_their_own_tokens(pair, table):
  a, b = pair
  first = _run(Decoder(a, CFG))
  assert len(table) == 2 and table.hits == 0  # its prefill and step
  second = _run(Decoder(b, CFG))
  assert table.hits == 2 and second.compile_s == 0.0
  table.enabled = False  # the same decoder compiling its own programs
  alone = _run(Decoder(b, CFG))
  assert alone.compile_s > 0
  assert second.tokens == alone.tokens != first.tokens


def test_speculative_engines_share_programs_and_stay_lossless(pair, table):
  a, b = pair
  greedy_identity(SpeculativeEngine(a, CFG, ChainProposer(b, CFG, CFG, gamma=3)), a, CFG, PROMPTS,
                  max_new_tokens=12)
  hits = table.hits
  # the same method with the roles of the weights swapped: every program shared, and its
  # output is its own target's plain greedy output
  swapped = SpeculativeEngine(b, CFG, ChainProposer(a, CFG, CFG, gamma=3))
  res = greedy_identity(swapped, b, CFG, PROMPTS, max_new_tokens=12)
  assert table.hits > hits and res.compile_s == 0.0


def test_what_builds_another_program_is_not_shared(pair, table):
  """Another gamma (the proposer's key), drafter weights in bf16 (the params signature),
  another target config with weights of the same shapes, a mesh: each builds its own (the
  first two over the same target take its prefill, `target_prefill`, and the first over the
  same drafter its cache prefill, `cache_prefill`, and nothing else)."""
  from vocabjax.sharding import make_mesh

  a, b = pair
  _run(SpeculativeEngine(a, CFG, ChainProposer(b, CFG, CFG, gamma=3)))
  other = dataclasses.replace(CFG, rope_theta=CFG.rope_theta * 2)
  mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
  for dec, shared in ((SpeculativeEngine(a, CFG, ChainProposer(b, CFG, CFG, gamma=2)), 2),
                      (SpeculativeEngine(a, CFG, ChainProposer(cast_weights(b, "bfloat16"), CFG,
                                                               CFG, gamma=3)), 1),
                      (SpeculativeEngine(a, other, ChainProposer(b, other, other, gamma=3)), 0),
                      (SpeculativeEngine(a, CFG, ChainProposer(b, CFG, CFG, gamma=3),
                                         mesh=mesh), 0)):
    hits = table.hits
    res = _run(dec)
    assert table.hits == hits + shared and res.compile_s > 0, dec


class _KeyMissesGamma(ChainProposer):
  """A proposer whose key() forgets a setting its programs read (a broken contract)."""

  def key(self):
    return ("chain", self.config, self.policy, self.draft_prefill)


def test_check_mode_finds_a_key_that_misses_a_setting(pair, table):
  a, b = pair
  table.check = True
  _run(SpeculativeEngine(a, CFG, _KeyMissesGamma(b, CFG, CFG, gamma=3)))
  same = _run(SpeculativeEngine(a, CFG, _KeyMissesGamma(b, CFG, CFG, gamma=3)))  # checked: equal
  assert table.hits >= 2 and same.compile_s == 0.0
  with pytest.raises(engine.SharedProgramMismatch, match="not in its key"):
    _run(SpeculativeEngine(a, CFG, _KeyMissesGamma(b, CFG, CFG, gamma=2)))


def test_the_cache_is_bounded_least_recently_used_first():
  t = engine.ProgramCache(max_programs=2)
  key = lambda name: engine.ProgramKey(name, "m", None, (), None)  # noqa: E731
  built = []

  def build(name):
    built.append(name)
    return name.upper()

  for k in "abc":
    assert t.get(key(k), "scope", lambda k=k: build(k))[0] == k.upper()
  assert len(t) == 2 and built == ["a", "b", "c"]
  assert t.get(key("b"), "scope", lambda: build("b"))[0] == "B" and built == ["a", "b", "c"]
  t.get(key("a"), "scope", lambda: build("a"))  # "a" was dropped: built again, "c" dropped
  assert built == ["a", "b", "c", "a"]
  t.get(key("b"), "scope", lambda: build("b"))
  assert built == ["a", "b", "c", "a"] and t.hits == 2
  t.get(key("b"), "another scope", lambda: build("b"))  # a scope of its own: built
  assert built[-1] == "b" and len(built) == 5
  with pytest.raises(TypeError, match="ProgramKey"):
    t.get(("b",), "scope", lambda: "B")
  t.clear()
  assert len(t) == 0


def test_each_build_gives_the_heap_back(monkeypatch):
  """A program built (not one taken from the cache) in at least `trim_after_s` is followed by
  `trim_heap`: compiling frees far more than the program keeps, and glibc kept it resident
  (the main job's peak); a quicker build is not; `VOCABJAX_TRIM_HEAP=0` turns it off."""
  import platform

  from vocabjax import backends

  calls = []
  monkeypatch.setattr(engine, "trim_heap", lambda: calls.append(1) or True)
  t = engine.ProgramCache()
  key = engine.ProgramKey("p", "m", None, (), None)
  t.get(key, "scope", lambda: "P")  # a quick build: not worth a collection
  assert calls == []
  t.trim_after_s = 0.0
  t.get(key._replace(program="q"), "scope", lambda: "Q")
  t.get(key._replace(program="q"), "scope", lambda: "Q")  # taken from the cache: no build
  assert calls == [1]
  monkeypatch.setenv("VOCABJAX_TRIM_HEAP", "0")
  assert backends.trim_heap() is False
  monkeypatch.delenv("VOCABJAX_TRIM_HEAP")
  glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
  assert backends.trim_heap() is glibc
