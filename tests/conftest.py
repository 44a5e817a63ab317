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
# each kernel and XLA:CPU's MLIR fusion emitters. On the CPU the suite compiles with LLVM at
# -O0 and XLA:CPU's older elementwise emitters (FAST_XLA_OPTIONS: every XLA graph pass, the
# fusion decisions and the dot library calls stay as they are), about 3x cheaper, and in one
# piece (codegen split count 1: at -O0, splitting a program's LLVM module over threads costs
# more than it saves, and both xdist workers hold the 2 cores anyway: -6% wall). The
# properties the tests check (the same tokens as plain decoding, the target's law) are the
# algorithm's and hold under either setting, but such a program is not the one a user runs
# (LLVM -O2 forms FMAs, -O0 does not), so the tests marked `full_opt` -- one greedy-identity
# case per method and weight path -- compile at the settings users get, and
# VOCABJAX_TEST_COMPILE=full compiles the whole suite so. Only CPU programs are compiled fast:
# the deviceless TPU compiles are always users' (and the GPU exactness run, JAX_PLATFORMS=
# cuda,cpu, compiles everything as users do).
COMPILE = os.environ.get("VOCABJAX_TEST_COMPILE", "fast")
if COMPILE not in ("fast", "full"):
  raise ValueError(f"VOCABJAX_TEST_COMPILE={COMPILE!r}: choose fast or full")
FAST_COMPILE = COMPILE == "fast" and os.environ["JAX_PLATFORMS"] == "cpu"
FAST_XLA_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
                    "xla_cpu_parallel_codegen_split_count": 1}
_fast_now = [FAST_COMPILE]  # this test's setting (pytest_runtest_setup below)


def subprocess_xla_flags(device_count: int | None = None) -> str:
  """XLA_FLAGS for a test's CPU-only subprocess (a two-process run, the notebook's venv, the
  GPU run's dry run): `device_count` virtual CPU devices, and the suite's fast setting as
  flags. Flags reach every backend, and XLA:TPU refuses the CPU emitter flag: not for a
  subprocess that compiles for a TPU."""
  flags = [f"--xla_force_host_platform_device_count={device_count}"] if device_count else []
  if FAST_COMPILE:
    flags += [f"--{k}={str(v).lower()}" for k, v in FAST_XLA_OPTIONS.items()]
  return " ".join(flags)


if FAST_COMPILE:
  import inspect

  from jax._src import compiler as _jax_compiler

  _get_compile_options = _jax_compiler.get_compile_options
  # jax builds every program's options here (pxla.create_compile_options): a jax that no
  # longer does fails the suite's first import instead of silently compiling at -O2.
  assert {"backend", "env_options_overrides"} <= set(
      inspect.signature(_get_compile_options).parameters), "jax changed get_compile_options"

  def _get_compile_options_fast(*args, backend=None, env_options_overrides=None, **kw):
    """FAST_XLA_OPTIONS added to a CPU program's options (a part of its persistent-cache
    key, so fast and full programs never share an entry)."""
    if _fast_now[0] and backend is not None and backend.platform == "cpu":
      env_options_overrides = {**FAST_XLA_OPTIONS, **(env_options_overrides or {})}
    return _get_compile_options(*args, backend=backend,
                                env_options_overrides=env_options_overrides, **kw)

  _jax_compiler.get_compile_options = _get_compile_options_fast

import pytest  # noqa: E402

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """Tests marked `full_opt` compile at users' settings, the others fast (see COMPILE above),
  set before any of the test's fixtures (a module fixture may compile). jax's in-memory caches
  do not key on compile options (the persistent cache does), nor does the decoders' program
  cache (`engine.PROGRAMS`), so a switch clears them: a program compiled under one setting is
  never reused under the other."""
  if FAST_COMPILE:
    fast = item.get_closest_marker("full_opt") is None
    if _fast_now[0] != fast:
      import jax

      from vocabjax.decoding.engine import PROGRAMS

      jax.clear_caches()
      PROGRAMS.clear()
      _fast_now[0] = fast


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


def pytest_collection_modifyitems(config, items):
  """The tests marked `slow` (subprocess runs of tens of seconds) first: run last, one of them
  kept a worker busy while the other had nothing left (the suite's tail); run first, the
  workers share the rest as they free up. Otherwise the collection order is kept."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)
