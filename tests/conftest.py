"""Test setup: 8 virtual CPU devices (for the sharding tests) and tiny HF checkpoints."""

import os

# Must happen before jax is imported anywhere: the sharded tests need 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent XLA compilation cache for the whole run, shared by the xdist workers and the
# tests' subprocesses (and kept between runs): the suite compiles the same tiny programs many
# times (every test of a model pair builds its own decoders), and XLA:CPU's compile is most of
# a tiny program's cost (measured in tests/README.md). The cache key is the program's HLO, the
# compile options, the backend and jax's version, so a changed program is compiled afresh. Set
# VOCABJAX_TEST_JAX_CACHE=off to compile everything (or to a directory of your own).
_cache = os.environ.get("VOCABJAX_TEST_JAX_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "vocabjax", "jax-test-cache")
if _cache != "off":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # Unbounded (a run of changed programs adds ~140 MB; delete the directory to reclaim it):
  # JAX's LRU bound (JAX_COMPILATION_CACHE_MAX_SIZE) rescans every entry under a file lock on
  # each write, which made a full run more than twice as slow (tests/README.md).

# How XLA compiles the suite's programs. Most of the suite's time is XLA:CPU compiling tiny
# programs (tests/README.md), and for programs this small most of a compile is LLVM optimizing
# each kernel and XLA:CPU's MLIR fusion emitters. By default (VOCABJAX_TEST_COMPILE=fast) the
# suite compiles its CPU programs with LLVM at -O0 and XLA:CPU's older elementwise emitters, in
# one piece (FAST_XLA_OPTIONS, set through XLA_FLAGS, JAX's public way: every XLA graph pass,
# the fusion decisions and the dot library calls stay as they are), about 3x cheaper. The
# properties the tests check (the same tokens as plain decoding, the target's law) are the
# algorithm's and hold under either setting, but such a program is not the one a user runs
# (LLVM -O2 forms FMAs, -O0 does not). XLA_FLAGS reach every backend of the process, and
# XLA:TPU refuses the CPU emitter flag, so a fast run leaves out (deselects, saying so) the
# tests marked `integration` (deviceless TPU/GPU compiles, multi-process runs, the notebook's
# fresh virtualenv, the GPU run's dry run) and `full_opt` (one greedy-identity case per method
# and weight path, compiled as users' programs are): `VOCABJAX_TEST_COMPILE=full` runs the
# whole suite at users' settings, and `.ci/run`'s second step runs those two marks so.
from tests.helpers.compile import (FAST_COMPILE, FAST_XLA_OPTIONS, flags,  # noqa: E402
                                   leave_to_full_run)
from tests.helpers.selection import EXTENDED_MODES, ExtendedCheck, select_extended  # noqa: E402

if FAST_COMPILE:  # before jax starts its CPU backend (it reads XLA_FLAGS then); once (xdist's
  # workers inherit the controller's environment)
  _have = os.environ["XLA_FLAGS"].split()
  os.environ["XLA_FLAGS"] = " ".join([*_have, *[f for f in flags(FAST_XLA_OPTIONS)
                                                 if f not in _have]])

import pytest  # noqa: E402

pytest_plugins = ("pytester",)  # tests/test_suite_settings.py runs the collection hook

import jax  # noqa: E402

from tests.helpers.models import CFG, SMALL, as_test_dtype  # noqa: E402
from vocabjax.models import init_params  # noqa: E402
from vocabjax.testing.tiny import TINY_VARIANTS, save_tiny_variant  # noqa: E402

# VOCABJAX_TEST_PROFILE=PREFIX: each worker appends, per test, what compiling cost it (jax's
# monitoring events: programs compiled / read from the persistent cache, seconds tracing,
# lowering, compiling, the compiled programs by name, those read back by name) to
# PREFIX.<pid>.jsonl (tests/README.md reads them).
_PROFILE = os.environ.get("VOCABJAX_TEST_PROFILE")
_prof: dict = {}
if _PROFILE:
  import json
  import time

  import jax

  _EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
             "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
             "/jax/core/compile/backend_compile_duration": "compile_s"}

  def _on_duration(event, duration, **kw):
    name = _EVENTS.get(event)
    if name and _prof:
      _prof[name] = _prof.get(name, 0.0) + duration
      if name == "compile_s":
        hit = _prof.pop("_hit", False)
        key = "hit_s" if hit else "miss_s"
        _prof[key] = _prof.get(key, 0.0) + duration
        if not hit and duration > 0.2:
          progs = _prof.setdefault("programs", {})
          f = str(kw.get("fun_name"))
          progs[f] = round(progs.get(f, 0.0) + duration, 3)
        elif hit:  # read back from the persistent cache: count them by name
          loaded = _prof.setdefault("loaded", {})
          f = str(kw.get("fun_name"))
          loaded[f] = loaded.get(f, 0) + 1

  def _on_event(event, **kw):
    if _prof and event == "/jax/compilation_cache/cache_hits":
      _prof["_hit"] = True
      _prof["hits"] = _prof.get("hits", 0) + 1
    elif _prof and event == "/jax/compilation_cache/cache_misses":
      _prof["misses"] = _prof.get("misses", 0) + 1

  jax.monitoring.register_event_duration_secs_listener(_on_duration)
  jax.monitoring.register_event_listener(_on_event)

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    _prof.clear()
    _prof.update(test=item.nodeid, start=time.time())
    yield
    _prof["wall_s"] = round(time.time() - _prof.pop("start"), 3)
    _prof.pop("_hit", None)
    with open(f"{_PROFILE}.{os.getpid()}.jsonl", "a") as f:
      f.write(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in _prof.items()}) + "\n")
    _prof.clear()


def pytest_configure(config):
  config.pluginmanager.register(ExtendedCheck(), "vocabjax-extended-check")


def pytest_addoption(parser):
  parser.addoption("--extended", choices=EXTENDED_MODES, default="no",
                   help="the tests marked extended (pipelines end to end, more references and "
                        "configurations; tests/helpers/selection.py): no (the default: the "
                        "core alone), also (the core and them), only (them alone: .ci/run's "
                        "second step)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """The core or the extended tests (`--extended`); a fast run (the default) leaves the tests
  that need users' compile settings to a full one (module comment above; the report header
  says how to run them), and runs the slow ones first."""
  select_extended(config, items)
  leave_to_full_run(config, items)
  # the tests marked `slow` (subprocess runs of tens of seconds) first: run last, one of them
  # kept a worker busy while the other had nothing left (the suite's tail); run first, the
  # workers share the rest as they free up. Otherwise the collection order is kept.
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config):
  extended = {"no": "the core (tests marked extended are left out: --extended only runs them)",
              "also": "the core and the extended tests",
              "only": "the extended tests alone"}[config.getoption("extended")]
  if FAST_COMPILE:
    return [f"tests: {extended}",
            "compile: fast (CPU programs at LLVM -O0, XLA_FLAGS); tests marked integration or "
            "full_opt are left out: VOCABJAX_TEST_COMPILE=full python -m pytest -m "
            "'integration or full_opt' tests runs them (.ci/run's second step)"]
  return [f"tests: {extended}", "compile: full (users' XLA settings)"]


@pytest.fixture(autouse=True)
def _fresh_programs_when_patched(request):
  """The decoders' programs are shared across tests (`engine.PROGRAMS`: keyed by what they are
  built from, as jax's caches are, not by module constants). A test that patches something
  (`monkeypatch`: a ring's slack, a verifier replaced) may change what a program traces, so
  the cache is cleared around it, as `jax.clear_caches()` would be: it neither takes programs
  built before nor leaves its own to the tests after."""
  if "monkeypatch" not in request.fixturenames:
    yield
    return
  from vocabjax.decoding.engine import PROGRAMS

  PROGRAMS.clear()
  try:
    yield
  finally:
    PROGRAMS.clear()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
  """variant name -> a saved tiny HF checkpoint directory (built once per session)."""
  root = tmp_path_factory.mktemp("tiny")
  return {v: save_tiny_variant(v, root / v) for v in TINY_VARIANTS}


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory):
  """A tiny Qwen2 checkpoint with a byte-level BPE tokenizer and a chat template."""
  return save_tiny_variant("qwen2_bias", tmp_path_factory.mktemp("chat") / "m", seed=3,
                           with_tokenizer=True)


@pytest.fixture(scope="session")
def tiny_thinking_dir(tiny_chat_dir, tmp_path_factory):
  """`tiny_chat_dir` whose chat template reads a variable as Qwen3's does: it ends the prompt
  with `<think></think>` when rendered with enable_thinking=false."""
  import shutil

  from transformers import AutoTokenizer

  d = tmp_path_factory.mktemp("thinking") / "m"
  shutil.copytree(tiny_chat_dir, d)
  tok = AutoTokenizer.from_pretrained(d)
  tok.chat_template = tok.chat_template + (
      "{% if enable_thinking is defined and enable_thinking is false %}<think></think>"
      "{% endif %}")
  tok.save_pretrained(d)
  return d


@pytest.fixture(scope="session")
def tiny_medusa_dir(tiny_chat_dir, tmp_path_factory):
  """Two random Medusa-1 heads (shared LM head) for `tiny_chat_dir`, in Medusa's layout."""
  import jax
  import numpy as np

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.checkpoints.medusa import save_medusa
  from vocabjax.models.medusa import MedusaConfig, init_medusa
  from vocabjax.train.features import model_identity

  m = load_model(tiny_chat_dir, dtype="float32")
  mc = MedusaConfig(num_heads=2, hidden_size=m.config.hidden_size,
                    vocab_size=m.config.vocab_size, shared_lm_head=True)
  p = init_medusa(jax.random.key(0), mc)
  for h in p["heads"]:  # zero-initialized heads would all predict the base token
    h["w"] = jax.numpy.asarray(np.random.RandomState(1).randn(*h["w"].shape) * 0.1)
  return save_medusa(p, mc, tmp_path_factory.mktemp("medusa") / "heads",
                     target=model_identity(m))


# The model pairs shared by the speculative-decoding tests. `VOCABJAX_TEST_DTYPE=bfloat16` casts
# their weights (target and drafter) to bf16, so that the exactness tests built on them (greedy
# identity, chi-square) check the bf16 programs: `eval/gpu_exactness.py` runs them that
# way on a GPU. Unset, they are f32 (the CPU reference).

@pytest.fixture(scope="session")
def pair():
  """A target and a drafter that agree often but not always (the drafter is a noisy copy)."""
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  noise = init_params(jax.random.key(1), CFG, scale=0.3)
  draft = jax.tree.map(lambda a, b: a + 0.5 * b, target, noise)
  return as_test_dtype(target), as_test_dtype(draft)


@pytest.fixture(scope="session")
def small_pair():
  """V = 8 target and an unrelated drafter: many rejections, exact laws computable."""
  return (as_test_dtype(init_params(jax.random.key(10), SMALL, scale=0.8)),
          as_test_dtype(init_params(jax.random.key(11), SMALL, scale=0.8)))
