"""Whole decoding steps of every method, compiled for TPUs on a host without one (libtpu's
compiler, `vocabjax.testing.tpu_aot`), and what the compiled programs say about a TPU.

Letters: B batch rows, S cache slots, T prompt block, V vocabulary, D hidden size.

    step = lower_step("chain_g3", Setup(target_cfg, draft_cfg), topology="v5e:1x1", S=1024,
                      compile=True)
    step.programs["step"].compiled.memory_analysis(), .cost_analysis()

The decoders are the library's own (`SpeculativeEngine` with their proposers), built
with ABSTRACT weights: a decoder's constructor runs under `jax.make_jaxpr` on
ShapeDtypeStructs, so no weight is ever materialized (a 7-8B target costs no host memory), and
every array it keeps (its params after layout changes, attached vocabulary policies, shardings
from `vocabjax.sharding`) comes back as a ShapeDtypeStruct placed on the topology's TPU devices
(a `jax.device_put` in the constructor gives that array its NamedSharding, read from the traced
program). Where a constructor needs concrete values they are small stand-ins: a static subset's
ids (the first K ids), a random ranker's matrices (zeros of [V, R] and [R, D]: only their shapes
reach the program), tiny trained tokenizers for the cross-vocabulary id map (a [Vd] int32 array
in the program whatever it holds). The programs are then the decoder's own: its `lower()` (the
one way every decoder builds its programs, which its `programs()` compiles too: same function,
donation and out_shardings on a mesh), given the abstract placed weights, for
the TPU devices: what compiles here is what the decoder runs on a TPU.

The platform is the decoder's, not the host's: decoders built inside `tpu_tracing` are built
for "tpu" (`lowering.platform_default`; on a mesh, the mesh's devices say so), so their
`Lowering` has the platform, no CPU kernel (`cpu_matmul.linear` never reaches the C++ CPU
custom call, nor widens bf16 weights as on XLA:CPU), the MLP layout and the chain's two-token
first drafting call of an accelerator (`speculative.block_layout` / `fold_catch_up` read the
lowering), drafting top-ks in two stages, and on a mesh the mesh switches
(`Lowering.split_top_k`, `row_writes`). Nothing reads or patches `jax.default_backend()`.

`project` (`python -m vocabjax.bench tpu`) compiles each method's step for a topology (one
chip, or every chip with the model axis over them) and records per chip: memory from
`memory_analysis()` against the chip's HBM (CHIPS), the largest cache that fits, XLA's flops
and bytes accessed (from a loop-unrolled copy of the step: XLA counts a loop body once), the
roofline time, a modelled weight-stream time (`stream_bytes`: XLA:TPU's bytes accessed count
its VMEM prefetches again), and PROJECTED speedups tau x t(ar) / t(method) from a recorded
run's tau. A target that does not fit one chip of the topology by itself is an error (its
bytes, the HBM, a topology with enough chips); a method whose drafter or heads do not fit is a
row marked "does not fit" with its bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from vocabjax import sharding
from vocabjax.decoding.engine import PROGRAMS, ProgramKey
from vocabjax.bench.stand_ins import (  # noqa: F401  (NAME_FORMS, registry_form: re-exported)
    _HOST_ONLY, METHODS, NAME_FORMS, MethodSpec, Setup, _head_config, abstract_models,
    method_spec, registry_form)
from vocabjax.sampling import SamplingParams
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import Lowering, decoding_lowering, loops_unrolled, platform_default
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.testing.tpu_aot import compile_failure, not_cached, tpu_devices
from vocabjax.vocab.policy import POLICY_STATE
from vocabjax.vocab.ranked import SpeculativeVocab

__all__ = ["CHIPS", "METHODS", "Chip", "Program", "Setup", "TpuStep", "build_decoder",
           "chip_of", "cpu_custom_calls", "devices_of", "lower_step", "platform_of", "tpu_mesh",
           "tpu_tracing"]

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures of a TPU generation."""

  name: str
  hbm_bytes: int  # HBM capacity per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  bf16_flops_per_s: float  # peak dense bf16 compute per chip
  source: str


# Google Cloud's TPU documentation, per chip (read 2026): v5e "16 GB, 819 GBps, 197 TFLOPs
# (bf16)" (https://cloud.google.com/tpu/docs/v5e; the chip's HBM2 is 16 GiB); v6e "32 GB,
# 1640 GBps, 918 TFLOPs" (https://cloud.google.com/tpu/docs/v6e; a later revision writes 1638
# GBps); v5p "95 GiB, 2765 GBps, 459 TFLOPs" (https://cloud.google.com/tpu/docs/v5p).
CHIPS: dict[str, Chip] = {
    "v5e": Chip("TPU v5e", 16 * GiB, 819e9, 197e12, "https://cloud.google.com/tpu/docs/v5e"),
    "v6e": Chip("TPU v6e", 32 * GiB, 1640e9, 918e12, "https://cloud.google.com/tpu/docs/v6e"),
    "v5p": Chip("TPU v5p", 95 * GiB, 2765e9, 459e12, "https://cloud.google.com/tpu/docs/v5p"),
}


def chip_of(topology: str) -> Chip:
  """The Chip of a topology name such as "v5e:2x2" (ValueError naming it otherwise)."""
  gen = topology.split(":", 1)[0]
  if gen not in CHIPS:
    raise ValueError(f"no published chip figures for TPU topology {topology!r}: the table "
                     f"vocabjax.bench.tpu.CHIPS has {sorted(CHIPS)}")
  return CHIPS[gen]


# --- tracing for a TPU on this host ----------------------------------------------------------

def devices_of(topology: str) -> tuple:
  """The compile-only devices of `topology`: a TPU slice ("v5e:2x2", libtpu) or one GPU
  ("gpu:h100", "gpu:h200": `vocabjax.testing.gpu_aot`, JAX's CUDA plugin)."""
  if topology.startswith("gpu:"):
    from vocabjax.testing import gpu_aot  # local: loads JAX's CUDA plugin only for GPU topologies

    return gpu_aot.gpu_devices(topology[4:])
  return tpu_devices(topology)


def platform_of(topology: str) -> str:
  """"gpu" for a "gpu:<target>" topology, else "tpu"."""
  return "gpu" if topology.startswith("gpu:") else "tpu"


@contextlib.contextmanager
def tpu_tracing(device=None, mesh=None, platform: str = "tpu"):
  """Build and trace programs inside as a TPU's decoder would (module doc): decoders built
  inside are built for `platform` ("gpu" for a GPU's, `vocabjax.testing.gpu_aot`:
  `lowering.platform_default`, so their lowering has no CPU kernel and their layout and
  drafting calls are a TPU's), and (with `device`, a TPU device) Pallas lowering rules see that
  device as the default device. (`mesh` is kept for the callers: a decoder on a mesh takes
  its platform from the mesh's devices.)"""
  del mesh
  with contextlib.ExitStack() as stack:
    stack.enter_context(platform_default(platform))
    if device is not None:
      stack.enter_context(jax.default_device(device))
    yield


def cpu_custom_calls(text: str) -> list[str]:
  """The CPU-only custom-call targets of `vocabjax.kernels.cpu_matmul` named in a lowered
  program's text (none may reach a TPU program)."""
  names = {*cpu_matmul._TARGETS.values(), *cpu_matmul._GEMM_TARGETS.values(),
           "VjSkinnyMatmul", "VjGemmBF16"}
  return sorted(n for n in names if n in text)


def tpu_mesh(topology: str, data: int = 1):
  """A ("data", "model") mesh over the topology's chips, the model axis over the rest."""
  devices = tpu_devices(topology)
  if len(devices) % data:
    raise ValueError(f"data axis {data} does not divide the {len(devices)} chips of "
                     f"{topology!r}")
  return sharding.make_mesh(data=data, model=len(devices) // data, devices=devices)


def _traced(value) -> bool:
  leaves = jax.tree.leaves(value)
  return bool(leaves) and all(isinstance(x, (jax.core.Tracer, jax.Array)) for x in leaves)


def _placements(jaxpr) -> list:
  """The sharding a `jax.device_put` gave each output of `jaxpr` (None where none did)."""
  made = {}
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "device_put":
      for var, dst in zip(eqn.outvars, eqn.params["devices"]):
        if isinstance(dst, jax.sharding.Sharding):
          made[var] = dst
  return [None if hasattr(v, "val") else made.get(v) for v in jaxpr.outvars]


def build_decoder(method: str, setup: Setup, *, device=None, mesh=None, platform: str = "tpu"):
  """The method's decoder with abstract weights placed on `device` (one TPU chip, or one GPU
  with `platform="gpu"`) or `mesh` (a mesh of TPU chips, `tpu_mesh`): module doc."""
  spec = method_spec(method)
  if (device is None) == (mesh is None):
    raise ValueError("give a TPU device or a mesh of TPU devices (not both)")
  arrays = abstract_models(setup, spec.needs)
  names = list(arrays)
  held = {}

  def construct(*values):
    dec = spec.build(dict(zip(names, values)), setup, mesh)
    held["decoder"] = dec
    return _held(dec)

  with tpu_tracing(mesh=mesh, platform=platform):  # switches as on a TPU; values stay here
    closed, shapes = jax.make_jaxpr(construct, return_shape=True)(*(arrays[n] for n in names))
  leaves, tree = jax.tree.flatten(shapes)
  default = SingleDeviceSharding(device) if mesh is None else sharding.replicated(mesh)
  placed = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where or default)
            for x, where in zip(leaves, _placements(closed.jaxpr))]
  dec = held["decoder"]
  for name, value in jax.tree.unflatten(tree, placed).items():
    owner, attr = (dec.proposer, name[len("proposer."):]) if name.startswith("proposer.") \
        else (dec, name)
    setattr(owner, attr, value)
  return dec


def _held(dec, pred=None) -> dict:
  """The arrays a decoder holds, by attribute ("proposer.<name>" for its proposer's)."""
  pred = pred or _traced
  out = {k: v for k, v in vars(dec).items() if pred(v)}
  proposer = vars(dec).get("proposer")
  if proposer is not None:
    out.update({"proposer." + k: v for k, v in vars(proposer).items() if pred(v)})
  return out


@dataclasses.dataclass
class Program:
  """One program of a step (or a prefill): its Lowered, and its Compiled once compiled."""

  name: str
  lowered: Any
  compiled: Any = None

  @property
  def text(self) -> str:
    """The StableHLO the TPU compiler gets (compiled TPU text is unreliable deviceless)."""
    return self.lowered.as_text()


@dataclasses.dataclass
class TpuStep:
  """A method's step programs for a topology (and its prefills when asked)."""

  method: str
  topology: str
  setup: Setup
  B: int
  S: int
  decoder: Any
  programs: dict  # name -> Program
  step_programs: tuple  # the programs one decoding step runs, in order
  caches: list  # the step's KV caches (abstract, placed)
  spec: MethodSpec | None = None

  @property
  def cost_programs(self) -> tuple:
    """The programs whose cost analysis counts the step: the loop-unrolled copies where they
    were lowered (`lower_step(costs=True)`), else the step's own."""
    return tuple("cost:" + n if "cost:" + n in self.programs else n
                 for n in self.step_programs)

  def cache_bytes_per_chip(self) -> int:
    """Bytes of the step's KV caches on one chip (k and v; their shards on a mesh)."""
    return sum(_cache_bytes(c) for c in self.caches)

  def ring_bytes_per_chip(self) -> int:
    """Of those, the sliding layers' rings: a fixed size, not growing with the cache's slots."""
    return sum(_cache_bytes(c) - _cache_bytes(c, ring=False) for c in self.caches)

  def compile(self, names=None) -> "TpuStep":
    """Compile the programs (default: all), each program once per process and topology: two
    methods whose step is the same program (prompt lookup's, the n-gram table's and
    SuffixDecoding's chains verify host drafts of the same shapes) share one compile (the
    StableHLO text and the topology are the key); errors as `lower_step`'s."""
    for name in names or self.programs:
      prog = self.programs[name]
      if prog.compiled is None:
        key = ProgramKey("deviceless", hashlib.sha256(prog.text.encode()).hexdigest(), None,
                         (self.topology,), None)

        def build(name=name, prog=prog):
          with not_cached():  # a deviceless executable cannot be loaded back from the cache
            return _guarded(self, name, prog.lowered.compile)

        prog.compiled, _ = PROGRAMS.get(key, "deviceless", build)
    return self


def _cache_bytes(cache, ring: bool = True) -> int:
  """Bytes per chip of a KV cache's buffers (a sliding layers' ring included unless `ring` is
  False)."""
  return sum(_bytes_per_chip(x) for name, x in cache.kv_arrays().items()
             if ring or not name.endswith("_local"))


def _kv_bytes_per_chip(config: LlamaLikeConfig, B: int, S: int, dtype, mesh) -> int:
  """Bytes on one chip of the KV cache `KVCache.init(config, B, S)` makes (its sliding layers
  in a ring past their window), without making it."""
  shapes = jax.eval_shape(lambda: KVCache.init(config, B, S, dtype))
  slots = sum(int(np.prod(x.shape[:3])) for x in shapes.kv_arrays().values())
  return slots * _kv_bytes_per_slot_per_chip(config, dtype, mesh)


def _bytes_per_chip(x) -> int:
  shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
  return int(np.prod(shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize


def _guarded(step_or_where, name: str, fn):
  """fn() with any error re-raised as AssertionError naming the method, program, topology and
  shapes (the style of `tpu_aot.compile_for_tpu`)."""
  try:
    return fn()
  except Exception as e:  # MosaicError, JaxRuntimeError (RESOURCE_EXHAUSTED), lowering errors
    err = e
  where = (step_or_where if isinstance(step_or_where, str) else
           _where(step_or_where.method, step_or_where.topology, step_or_where.setup,
                  step_or_where.B, step_or_where.S))
  raise compile_failure(f"{where}: program {name!r} does not compile", err) from err


def _where(method, topology, setup, B, S) -> str:
  c = setup.target
  cache = f"{jnp.dtype(setup.dtype).name}{[c.num_layers, B, S, c.num_kv_heads, c.head_dim]}"
  kind = "GPU" if platform_of(topology) == "gpu" else "TPU"
  return (f"{method} for {kind} {topology} ({setup.describe()}; B={B}, S={S}; the target's K and "
          f"V caches {cache})")


def _sds(shape, dtype, where):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=where)


def lower_step(method: str, setup: Setup, *, topology: str = "v5e:1x1", B: int = 1,
               S: int = 1024, T: int = 128, mesh=None, compile: bool = False,
               prefill: bool = False, costs: bool = False,
               sampling: SamplingParams = SamplingParams(), decoder=None) -> TpuStep:
  """The LOWERED whole step of `method` (a name of METHODS / NAME_FORMS) for `topology`: its
  decoder's step function over B rows and S cache slots, weights abstract and placed on the
  topology's first chip ("gpu:h100" / "gpu:h200": one GPU, `devices_of`), or on `mesh`
  (`tpu_mesh(topology)`: every chip, the model axis over them). `prefill`: also the prompt prefill
  programs of a [B, T] block. `costs`: also the step with its loops unrolled ("cost:<program>";
  `TpuStep.cost_programs`), whose cost analysis counts every iteration (XLA's counts a loop body
  once). `compile`: compile them all (deviceless). `decoder`: one `build_decoder` made for the
  same placement (to share it). Errors (Mosaic, lowering, memory) are AssertionErrors naming the
  method, topology, program and shapes."""
  if not 1 <= T <= S:
    raise ValueError(f"prompt block T={T} must be in [1, S={S}]")
  spec = method_spec(method)
  device, platform = devices_of(topology)[0], platform_of(topology)
  if mesh is not None and set(mesh.devices.flat) - set(devices_of(topology)):
    raise ValueError(f"the mesh's devices are not the chips of {topology!r}")
  where = _where(method, topology, setup, B, S)
  if decoder is None:
    decoder = _guarded(where, "decoder", lambda: build_decoder(
        method, setup, device=None if mesh is not None else device, mesh=mesh,
        platform=platform))
  unrolled_dec = None
  if costs and spec.loops:  # the same decoder with its drafting loops traced unrolled
    with loops_unrolled(spec.while_trips):
      unrolled_dec = _guarded(where, "decoder (loops unrolled)", lambda: build_decoder(
          method, setup, device=None if mesh is not None else device, mesh=mesh,
          platform=platform))
  with tpu_tracing(device, mesh, platform):
    step = _guarded(where, "step", lambda: _lower(method, decoder, setup, B, S, T, device,
                                                  mesh, prefill, sampling, topology))
    step.spec = spec
    if unrolled_dec is not None:
      with loops_unrolled(spec.while_trips):
        unrolled = _guarded(where, "step (loops unrolled)", lambda: _lower(
            method, unrolled_dec, setup, B, S, T, device, mesh, False, sampling, topology))
      for name in spec.loop_programs:
        step.programs["cost:" + name] = dataclasses.replace(unrolled.programs[name],
                                                            name="cost:" + name)
  if compile:
    with tpu_tracing(device, mesh, platform):
      step.compile()
  return step


def tpu_lowering(mesh, platform: str = "tpu") -> Lowering:
  """What a decoder's programs lower with on TPU chips (`decoding_lowering` for "tpu"): no CPU
  kernel; a drafting top-k over the vocabulary in two stages of 4,096-token blocks (XLA:TPU
  sorts a whole row for a top-k); on a mesh top-k as argmax rounds and per-row cache writes.
  `platform="gpu"`: a GPU's."""
  return decoding_lowering(mesh=mesh, platform=platform)


def _lower(method, dec, setup, B, S, T, device, mesh, prefill, sampling, topology) -> TpuStep:
  """The decoder's own programs (`lower`: the one way every decoder builds them), lowered for
  the topology's chips; bench adds nothing but the placement of the abstract weights."""
  del device
  # steps and prefills alike (any_rows and bf16_blocks are the CPU's): what the decoder was
  # built with under `tpu_tracing`
  lw = tpu_lowering(mesh, platform_of(topology))
  if dec.lowering != lw:
    raise ValueError(f"the decoder was built for {dec.lowering}, not {lw}: build it with "
                     f"build_decoder for the same placement")
  steps = tuple(dec.step_programs)
  wanted = steps + (tuple(dec.prefill_programs) if prefill else ())
  lowered_ = dec.lower(sampling, B, T, S, jnp.dtype(setup.dtype), programs=wanted)
  progs = {name: Program(name, lowered_[name]) for name in wanted}
  return TpuStep(method=method, topology=topology, setup=setup, B=B, S=S, decoder=dec,
                 programs=progs, step_programs=steps,
                 caches=list(dec.abstract_caches(B, S, jnp.dtype(setup.dtype))))


# --- projection: memory, cost analysis and roofline times per method ------------------------

class TpuProjectionError(ValueError):
  """Input the projection cannot use (its message names the value)."""


_TOPOLOGIES = {"v5e": (("1x1", 1), ("2x2", 4), ("2x4", 8), ("4x4", 16)),
               "v6e": (("1x1", 1), ("2x2", 4), ("2x4", 8), ("4x4", 16)),
               "v5p": (("1x1x1", 1), ("2x2x1", 4), ("2x2x2", 8), ("2x4x4", 32))}


def run_methods(run_dir) -> list[dict]:
  """An eval run's methods with a tau ({name, method, params, tau}) from its summary.json."""
  import json
  from pathlib import Path

  path = Path(run_dir) / "summary.json"
  if not path.is_file():
    raise TpuProjectionError(f"--run {run_dir}: no summary.json there (a finished `python -m "
                             f"vocabjax.eval` output directory)")
  try:
    summary = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise TpuProjectionError(f"{path}: not JSON ({e})") from None
  return [{"name": m["name"], "method": m.get("method", m["name"]),
           "params": dict(m.get("params") or {}), "tau": float(m["overall"]["tau"])}
          for m in summary.get("methods", []) if m.get("overall", {}).get("tau") is not None]


def match_tau(spec: MethodSpec, entries: list[dict]) -> dict | None:
  """The run's method whose step is this one: the same name, else the same registry method
  with the same step-shaping parameters (registry defaults filling what the run left out;
  host-only ones such as PLD's n-gram bounds or a head's path ignored). None if none."""
  for e in entries:
    if e["name"] == spec.name:
      return e
  if spec.params is None:
    return None
  from vocabjax.methods import METHODS as REGISTRY  # local: the registry only for defaults

  defaults = REGISTRY[spec.kind].defaults if spec.kind in REGISTRY else {}
  for e in entries:
    if e["method"] != spec.kind:
      continue
    given = {k: v for k, v in e["params"].items() if k not in _HOST_ONLY}
    full = {**defaults, **given}
    if (all(full.get(k) == v for k, v in spec.params.items())
        and all(v == defaults.get(k) for k, v in given.items() if k not in spec.params)):
      return e
  return None


def _weight_bytes_per_chip(dec) -> int:
  """Bytes per chip of every array a decoder holds (weights, attached policies, id maps)."""
  return sum(_bytes_per_chip(x) for v in _held(dec, _traced_abstract).values()
             for x in jax.tree.leaves(v))


def _traced_abstract(value) -> bool:
  leaves = jax.tree.leaves(value)
  return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def _suggest(topology: str, need_total: int, chip: Chip) -> str:
  """A topology of the same generation with more chips whose HBM holds `need_total` bytes
  split over its chips (with 10% to spare: not every array splits)."""
  gen = topology.split(":", 1)[0]
  have = len(tpu_devices(topology))
  for shape, n in _TOPOLOGIES.get(gen, ()):
    if n > have and need_total / n <= 0.9 * chip.hbm_bytes:
      return f"{gen}:{shape} ({n} chips)"
  return "a topology with more chips or a generation with more HBM per chip"


def _fmt_bytes(n: int) -> str:
  return f"{n:,} bytes ({n / GiB:.2f} GiB)"


def project(setup: Setup, topology: str, methods=METHODS, *, B: int = 1, S: int = 1024,
            run: str | None = None, unrolled_costs: bool = True, progress=None,
            on_row=None, taus: dict | None = None, labels: dict | None = None,
            paper: str | None = None) -> dict:
  """Compile each method's whole step for `topology` (deviceless; on every chip with the
  model axis over them when it has several) and project it (module doc of the CLI:
  `python -m vocabjax.bench tpu`). Returns {"rows": [...], ...}; `on_row(result)` is called
  after each method (to save partial results), `progress(text)` with what runs.

  TpuProjectionError when the target alone (plain decoding's weights and cache) does not fit
  one chip: a message with the bytes needed and available and a topology that would hold it.
  A method whose drafter or heads do not fit is a row marked "does not fit" with its bytes.

  `taus` ({method: (tau, source)}: a paper's published acceptance lengths, `--paper`) instead of
  a run's; `labels` ({method: the paper's name for it}); `paper`: the paper and its setting."""
  import time

  chip = chip_of(topology)
  devices = tpu_devices(topology)  # ValueError naming an unknown topology
  specs = [method_spec(m) for m in methods]
  if "ar" not in [s.name for s in specs]:
    raise TpuProjectionError("the methods must include ar: every speedup is against its step")
  entries = run_methods(run) if run else []
  mesh = tpu_mesh(topology) if len(devices) > 1 else None
  device = devices[0]
  say = progress or (lambda text: None)

  # the target alone: refused with its numbers before anything compiles
  ar = build_decoder("ar", setup, device=None if mesh is not None else device, mesh=mesh)
  kv_ar = _kv_bytes_per_chip(setup.target, B, S, setup.dtype, mesh)
  need = _weight_bytes_per_chip(ar) + kv_ar
  if need > chip.hbm_bytes:
    total = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
                for x in jax.tree.leaves(ar.params))
    where = (f"{len(devices)} chips, model axis {len(devices)}" if mesh is not None
             else "one chip")
    raise TpuProjectionError(
        f"{setup.target_name} ({setup.dtype}) does not fit {topology} ({where}): it needs "
        f"{_fmt_bytes(need - kv_ar)} of weights per chip plus {_fmt_bytes(kv_ar)} of KV cache "
        f"at B={B}, S={S}, i.e. {_fmt_bytes(need)} > {_fmt_bytes(chip.hbm_bytes)} of HBM per "
        f"{chip.name} chip; try {_suggest(topology, total + kv_ar, chip)}")

  result = {"topology": topology, "chips": len(devices),
            "chip": dataclasses.asdict(chip),
            "mesh": None if mesh is None else {"data": 1, "model": len(devices)},
            "setup": {"target": setup.target_name, "draft": setup.draft_name,
                      "cross_draft": setup.cross_draft_name or setup.draft_name,
                      "describe": setup.describe(), "dtype": setup.dtype,
                      "eagle_head": {"kind": setup.head_kind,
                                     "draft_vocab": _head_config(setup).draft_vocab_size,
                                     "intermediate": setup.head_intermediate},
                      "ranker_rank": setup.ranker_rank},
            "B": B, "S": S, "run": run, "paper": paper, "unrolled_costs": unrolled_costs,
            "rows": []}
  for spec in specs:
    say(f"{spec.name}: compiling for {topology} ...")
    t0 = time.perf_counter()
    row = {"method": spec.name, "kind": spec.kind, "about": spec.about}
    try:
      dec = ar if spec.name == "ar" else build_decoder(
          spec.name, setup, device=None if mesh is not None else device, mesh=mesh)
      row.update(_project_method(spec, dec, setup, topology, chip, B, S, device, mesh,
                                 unrolled_costs))
    except AssertionError as e:  # _guarded's: the method, program and shapes, then XLA's lines
      row["error"] = str(e)
      if "RESOURCE_EXHAUSTED" in row["error"]:  # XLA ran out of HBM (or VMEM) for it
        row["fits"] = False
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    hit = match_tau(spec, entries) if entries else None
    if hit is not None:
      row["tau"], row["tau_from"] = hit["tau"], hit["name"]
    if labels and spec.name in labels:
      row["label"] = labels[spec.name]
    if taus and spec.name in taus:
      tau, source = taus[spec.name]
      row["tau_source"] = source
      if tau is not None:
        row["tau"], row["tau_from"] = tau, "published"
    result["rows"].append(row)
    say(f"{spec.name}: " + ("error" if "error" in row else
                            "does not fit" if row.get("fits") is False else "ok")
        + f" ({row['compile_s']} s)")
    _speedups(result)
    if on_row is not None:
      on_row(result)
  return result


def _kv_bytes_per_slot_per_chip(config: LlamaLikeConfig, dtype, mesh) -> int:
  """One layer's K (or V) bytes per cache slot and row on one chip (KV heads split over
  "model" when they divide it, as `sharding.cache_specs`)."""
  heads = config.num_kv_heads
  if mesh is not None and heads % mesh.shape["model"] == 0:
    heads //= mesh.shape["model"]
  return heads * config.head_dim * jnp.dtype(dtype).itemsize


def _project_method(spec, dec, setup, topology, chip, B, S, device, mesh, unrolled_costs):
  step = lower_step(spec.name, setup, topology=topology, B=B, S=S, T=min(128, S), mesh=mesh,
                    decoder=dec, costs=unrolled_costs)
  kv = step.cache_bytes_per_chip()
  pre = _weight_bytes_per_chip(dec) + kv
  if pre > chip.hbm_bytes:  # XLA would refuse it (RESOURCE_EXHAUSTED): say it with bytes
    return {"fits": False, "needed_bytes": pre, "hbm_bytes": chip.hbm_bytes,
            "kv_bytes": kv, "weights_bytes": pre - kv,
            "note": f"does not fit: needs {_fmt_bytes(pre)} (weights {_fmt_bytes(pre - kv)}, "
                    f"KV {_fmt_bytes(kv)}) per chip > HBM {_fmt_bytes(chip.hbm_bytes)}; try "
                    f"{_suggest(topology, pre * len(tpu_devices(topology)), chip)}"}
  with tpu_tracing(device, mesh):
    step.compile(step.step_programs + step.cost_programs)
  mem = [step.programs[n].compiled.memory_analysis() for n in step.step_programs]
  args = sum(m.argument_size_in_bytes for m in mem)  # the programs' arguments are disjoint
  extra = max(m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
              for m in mem)
  temps = max(m.temp_size_in_bytes for m in mem)
  total = args + extra
  flops = bytes_ = 0.0
  for n in step.cost_programs:
    cost = step.programs[n].compiled.cost_analysis()
    flops += float(cost.get("flops", 0.0))
    bytes_ += float(cost.get("bytes accessed", 0.0))
  t_flops, t_bytes = flops / chip.bf16_flops_per_s, bytes_ / chip.hbm_bytes_per_s
  ring = step.ring_bytes_per_chip()  # sliding layers' rings: fixed, whatever the slots
  per_slot = (kv - ring) / S
  row = {"programs": list(step.step_programs), "cost_programs": list(step.cost_programs),
         "weights_bytes": args - kv, "kv_bytes": kv, "temp_bytes": temps,
         "total_bytes": total, "hbm_bytes": chip.hbm_bytes, "fits": total <= chip.hbm_bytes,
         "kv_bytes_per_slot": per_slot, "kv_ring_bytes": ring,
         "max_cache_slots": (int((chip.hbm_bytes - (total - (kv - ring))) // per_slot)
                             if per_slot else None),
         "model_max_positions": setup.target.max_position_embeddings,
         "flops": flops, "bytes_accessed": bytes_, "roofline_s": max(t_flops, t_bytes),
         "bound": "memory" if t_bytes >= t_flops else "compute",
         # every argument (weights, caches) read once: exact HBM traffic for a one-pass step,
         # a floor for one whose drafter or head runs several times
         "args_floor_s": args / chip.hbm_bytes_per_s,
         "drafter_passes": drafter_passes(spec, dec)}
  stream = stream_bytes(spec, step)
  row["stream_bytes"] = stream
  row["stream_s"] = max(flops / chip.bf16_flops_per_s, stream / chip.hbm_bytes_per_s)
  pallas = sum(step.programs[n].text.count("tpu_custom_call") for n in step.step_programs)
  if pallas:
    row["pallas_calls_lowered"] = pallas
    row["pallas_bytes_not_counted"] = _pallas_bytes(spec, setup, B, dec)
  if not row["fits"]:
    row["note"] = (f"does not fit: needs {_fmt_bytes(total)} per chip > HBM "
                   f"{_fmt_bytes(chip.hbm_bytes)}; try "
                   f"{_suggest(topology, total * len(tpu_devices(topology)), chip)}")
  return row


def drafter_passes(spec: MethodSpec, dec) -> int:
  """Passes over the drafter's (or heads') weights in one step: its calls (`drafter_calls`, as
  the decoder counts them on a TPU: a chain's first call feeds two tokens), crossvocab's G."""
  if spec.kind == "crossvocab":
    return spec.params["gamma"]
  calls = getattr(dec, "drafter_calls", None)  # as the decoder's lowering (a TPU's) counts
  return len(calls()) if calls is not None else 0


def stream_bytes(spec: MethodSpec, step: TpuStep) -> int:
  """HBM bytes one step streams per chip, modelled (not XLA's estimate): the target's arrays
  and its KV cache once; the drafter's (or heads') arrays and cache once per pass
  (`drafter_passes`); an embedding table only where it is also an LM head (a tied model's:
  lookups gather rows); a drafter's LM head not where a vocabulary policy replaces it (its
  subset rows or ranker are read per pass instead, and SpecVocab's kernel reads its k rows:
  `_pallas_bytes`)."""
  dec, setup = step.decoder, step.setup
  passes = drafter_passes(spec, dec)
  target = getattr(dec, "params", None) or dec.target_params
  total = _cache_bytes(step.caches[0])
  total += sum(passes * _cache_bytes(c) for c in step.caches[1:])
  tied_target = setup.target.tie_word_embeddings
  for key, tree in target.items():
    if key != "embed" or tied_target:
      total += sum(_bytes_per_chip(x) for x in jax.tree.leaves(tree))
  dp = getattr(dec, "proposer_params", None)  # plain decoding has none
  if dp is not None and dp is not target:
    policy = POLICY_STATE in dp or spec.kind in ("vocabtrim", "frspec", "specvocab")
    dc = getattr(dec.proposer, "draft_config", None)  # a head or heads: no embedding of their own
    tied = bool(dc is not None and dc.tie_word_embeddings)
    for key, tree in dp.items():
      if key == "lm_head" and policy:
        continue  # the policy's rows or kernel read the head instead
      if key == "embed" and (policy or not tied):
        continue  # lookups gather rows
      total += passes * sum(_bytes_per_chip(x) for x in jax.tree.leaves(tree))
  return total + (_pallas_bytes(spec, setup, step.B, dec) or 0)


def _pallas_bytes(spec, setup, B, dec=None) -> int | None:
  """HBM bytes SpecVocab's indexed-head kernel reads per step, which XLA's cost analysis does
  not count: every position a drafting call puts through the head (a chain's G calls one each;
  an EAGLE tree's first level one, each later level its top-k nodes: `drafter_calls`) DMAs its
  k candidates' rows, in pairs in bf16 (two rows share a 32-bit word), D wide."""
  vocab = getattr(getattr(dec, "proposer", dec), "draft_vocab", None)
  if not (spec.kind == "specvocab" or isinstance(vocab, SpeculativeVocab)):
    return None
  K = spec.params["k"]
  calls = getattr(dec, "drafter_calls", None)
  positions = (sum(h for _, h in calls()) if calls is not None
               else spec.params.get("gamma", 1))
  D = setup.target.hidden_size if spec.kind.startswith("eagle") else setup.draft.hidden_size
  item = jnp.dtype(setup.dtype).itemsize
  return positions * B * K * (4 // item) * D * item


def _speedups(result: dict) -> None:
  """PROJECTED speedup = tau x t(ar) / t(method), from XLA's roofline times and from the
  weight-stream times, where ar and the method have them."""
  ar = next((r for r in result["rows"] if r["method"] == "ar"), {})
  for r in result["rows"]:
    if r["method"] == "ar":
      r.setdefault("tau", 1.0)
    for t, out in (("roofline_s", "projected_speedup"), ("stream_s", "stream_speedup")):
      if ar.get(t) and r.get(t) and r.get("tau") is not None:
        r[out] = r["tau"] * ar[t] / r[t]


CANNOT_SEE = (
    "Pallas kernels (SpecVocab's indexed LM head) are opaque to XLA's cost analysis: its "
    "totals count no flops and no HBM bytes for them (the call's per-operand entry for U names "
    "the whole [V, D] table, which the total does not add); the rows' `Pallas bytes` column "
    "estimates what the kernel reads (k rows per drafting call, in pairs in bf16), left out of "
    "the roofline.",
    "Launch and dispatch overhead per program, the host loop between steps (EOS checks, PLD's "
    "n-gram lookup, crossvocab's translation between its draft and verify programs) and "
    "host-device transfers are not in a compiled program's cost.",
    "XLA's cost analysis counts a loop body once whatever its trip count; the drafting loops "
    "(a chain's scan, a tree's levels, crossvocab's while loop) are costed from a copy of the "
    "step with those loops unrolled (the `cost:` programs), unless --rolled-costs.",
    "`bytes accessed` is XLA:TPU's estimate over every memory space, not HBM traffic alone: "
    "weights its memory-space assignment prefetches into VMEM are counted again as VMEM "
    "writes and reads (Qwen2.5-Coder-1.5B's plain step: 6.9 GB for 3.1 GB of arguments, each "
    "layer ~4.4x its weights), so a memory-bound roofline time is pessimistic by up to that "
    "factor; the floor column reads each argument once (exact traffic for a one-pass step such "
    "as plain decoding's, a lower bound where a drafter or head runs several times).",
    "The roofline assumes peak HBM bandwidth or peak bf16 compute, whichever binds; collectives "
    "over ICI on a multi-chip mesh are not in it.",
    "tau comes from the recorded run (its models, greedy decoding, its machine); a method's "
    "steps are assumed to cost the same every step (a gated or PLD step that finds no match "
    "costs less).",
    "Max cache slots assumes the temporaries do not grow with S (attention's scores do, a "
    "little) and is capped by nothing but memory (see the model's max positions).",
)


PAPER_TAU_CAVEAT = (
    "tau is the paper's own (its models and weights, its GPU's numerics, its tree settings, its "
    "datasets; a summary's figure where the row's source says so): a TPU's bf16 numerics and "
    "this tree may accept differently, and a method's steps are assumed to cost the same every "
    "step.")


def render(result: dict) -> str:
  """The projection as markdown: every time is labelled PROJECTED."""
  chip = result["chip"]
  st = result["setup"]
  mesh = result["mesh"]
  where = (f"{result['chips']} chips, model axis over {mesh['model']}" if mesh else "one chip")
  lines = [f"# Deviceless TPU compile: {result['topology']} ({chip['name']}, {where}), "
           f"{st['target']} <- {st['draft']}", "",
           f"`{result.get('command', '')}`", "",
           f"- {result.get('date', '')}; jax {result.get('jax', '?')}, libtpu "
           f"{result.get('libtpu', '?')}; compiled on {result.get('host', 'this host')} "
           f"without a TPU (no time here was measured on a TPU)",
           f"- chip (published, {chip['source']}): HBM {chip['hbm_bytes'] / GiB:.0f} GiB "
           f"({chip['hbm_bytes']:,} bytes), {chip['hbm_bytes_per_s'] / 1e9:.0f} GB/s, bf16 peak "
           f"{chip['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s",
           f"- {st['describe']}; batch B={result['B']}, cache S={result['S']} slots; random "
           f"abstract weights; EAGLE head ({st['eagle_head'].get('kind', 'eagle3')}) "
           f"Vd={st['eagle_head']['draft_vocab']}, intermediate "
           f"{st['eagle_head']['intermediate']}; SpecVocab ranker rank {st['ranker_rank']}"
           + ("" if result.get("paper") else
              f"; crossvocab drafter {st['cross_draft']} (id map of tiny tokenizers: only its "
              f"[Vd] shape reaches the program)"),
           (f"- tau: PUBLISHED, from the paper (each row's source under the table): "
            f"{result['paper']}; every speedup below is a PROJECTION of that tau onto this "
            f"TPU's compiled step costs, not a measurement" if result.get("paper") else
            f"- tau: {result['run'] or 'no --run given'}"), "",
           "| method | programs | weights + inputs GiB | KV GiB | temps GiB | total GiB "
           "(HBM) | fits | max cache slots | GFLOP | GB accessed | PROJECTED roofline "
           "time us | PROJECTED floor us (arguments read once) | bound | Pallas bytes (not "
           "counted) | tau | PROJECTED speedup | GB streamed (model) | PROJECTED weight-stream "
           "time us | PROJECTED speedup (weight-stream) |",
           "|" + "---|" * 19]
  for r in result["rows"]:
    g = lambda k: f"{r[k] / GiB:.3f}" if r.get(k) is not None else "-"  # noqa: E731
    if "error" in r:
      first = r["error"].splitlines()
      msg = " ".join(x.strip() for x in first[1:3]) or first[0]
      lines.append(f"| {_name(r)} | - | - | - | - | - | "
                   f"{'no' if r.get('fits') is False else 'error'} | - | - | - | - | - | - | "
                   f"- | {_tau(r)} | - | - | - | - |")
      lines.append(f"|  | error: {msg[:300]} |" + " |" * 17)
      continue
    if r.get("roofline_s") is None:  # does not fit (checked before compiling)
      lines.append(f"| {_name(r)} | - | {g('weights_bytes')} | {g('kv_bytes')} | - | "
                   f"{r['needed_bytes'] / GiB:.3f} ({r['hbm_bytes'] / GiB:.0f}) | no: "
                   f"{r['needed_bytes']:,} > {r['hbm_bytes']:,} bytes | - | - | - | - | - | "
                   f"- | - | {_tau(r)} | - | - | - | - |")
      continue
    slots = r["max_cache_slots"]
    pb = r.get("pallas_bytes_not_counted")
    lines.append(
        f"| {_name(r)} | {' + '.join(r['cost_programs'])} | {g('weights_bytes')} | "
        f"{g('kv_bytes')} | {g('temp_bytes')} | {g('total_bytes')} "
        f"({r['hbm_bytes'] / GiB:.0f}) | {'yes' if r['fits'] else 'NO'} | "
        f"{slots:,} | {r['flops'] / 1e9:.2f} | {r['bytes_accessed'] / 1e9:.3f} | "
        f"PROJECTED {r['roofline_s'] * 1e6:.0f} | PROJECTED {r['args_floor_s'] * 1e6:.0f} | "
        f"{r['bound']} | "
        f"{'-' if pb is None else f'{pb / 1e6:.1f} MB'} | {_tau(r)} | "
        + (f"PROJECTED {r['projected_speedup']:.2f}x |" if "projected_speedup" in r
           else "- |")
        + f" {r['stream_bytes'] / 1e9:.3f} | PROJECTED {r['stream_s'] * 1e6:.0f} | "
        + (f"PROJECTED {r['stream_speedup']:.2f}x |" if "stream_speedup" in r else "- |"))
  lines += ["", "Methods:", ""]
  lines += [f"- `{r['method']}`: {r['about']}" + (f"; {r['note']}" if r.get("note") else "")
            + (f"; tau: {r['tau_source']}" if r.get("tau_source") else "")
            for r in result["rows"]]
  lines += ["", "PROJECTED: roofline time = max(XLA's flops / peak bf16 compute, XLA's bytes "
            "accessed / HBM bandwidth) per chip, from the compiled programs' cost analysis; "
            "weight-stream time = max(XLA's flops / peak, modelled streamed bytes / HBM "
            "bandwidth), the bytes being the target's arrays and KV cache once plus the "
            "drafter's (or heads') arrays and cache once per drafting pass (embedding tables "
            "only where they are an LM head, a policy's rows instead of the drafter's head, "
            "SpecVocab's kernel rows added); speedup = tau x t(ar) / t(method) for each. "
            "Nothing here ran on a TPU. What a projection cannot see:", ""]
  lines += [f"- {n}" for n in CANNOT_SEE if not (result.get("paper") and n.startswith("tau"))]
  if result.get("paper"):
    lines.append(f"- {PAPER_TAU_CAVEAT}")
  return "\n".join(lines) + "\n"


def _name(r) -> str:
  return f"{r['label']} (`{r['method']}`)" if r.get("label") else r["method"]


def _tau(r) -> str:
  if r.get("tau") is None:
    return "-"
  src = r.get("tau_from")
  return f"{r['tau']:.2f}" + (f" ({src})" if src and src != r["method"] else "")


# --- the matrix: every method's step on every generation, one chip and a slice ----------------

# one chip of each generation, and a 4-chip slice of each with the model axis over its chips
MATRIX_TOPOLOGIES = (("v5e:1x1", False), ("v6e:1x1", False), ("v5p:1x1x1", False),
                     ("v5e:2x2", True), ("v6e:2x2", True), ("v5p:2x2x1", True))
# every registered method's step, with each drafter vocabulary policy where it applies (full,
# a static subset: VocabTrim and FR-Spec run one program, SpecVocab's ranker with the Mosaic
# kernel; each policy on a chain: a tree under a policy runs the same policy per level, and
# costs 4-9 s more a topology to compile), in the registry's names; `ONE_DEVICE` methods (their trees are the host's, merged
# into a head's) on one chip only
# (trees of 2 levels: every level is the same program part, and each costs the compile seconds
# of a top-k over the vocabulary; prompt lookup's, the n-gram table's and SuffixDecoding's
# chains of 4 are one program, compiled once)
MATRIX_METHODS = (
    "ar", "chain:gamma=3", "vocabtrim:k=8192,gamma=3", "specvocab:k=2048,gamma=3",
    "tree:top_k=2,depth=2,total_tokens=4", "pld:gamma=4",
    "pld:gamma=4,candidates=2", "ngram:gamma=4", "suffix:max_spec_tokens=4",
    "suffix:max_spec_tokens=4,use_tree=true", "eagle:top_k=1,depth=3,total_tokens=3",
    "eagle:top_k=2,depth=2,total_tokens=4", "eagle_pld:top_k=2,depth=2,total_tokens=4",
    "eagle_suffix:top_k=2,depth=2,total_tokens=4,max_spec_tokens=4", "medusa:top_k=2,depth=2",
    "crossvocab:gamma=4", "tree_suffix:top_k=2,depth=2,total_tokens=4,max_spec_tokens=4")
ONE_DEVICE = ("eagle_pld", "eagle_suffix", "tree_suffix")


def matrix_setup(narrow: bool = False) -> Setup:
  """The matrix's models (configs only): Qwen2.5-0.5B's layers (D 896, 14 heads, 2 KV heads of
  64, F 4864) with its real vocabulary (V 151,936), a 2-layer target and a 1-layer drafter, and
  a V 32,000 llama drafter for the cross-vocabulary method; bf16. `narrow`: the same with
  layers of D 256 (4 heads, 2 KV heads of 64, F 512), which compile about a third faster: the
  test suite's matrix (every method, every topology, the real vocabulary), while `bench
  tpu-matrix` records Qwen's own layers."""
  D, F, H = (256, 512, 4) if narrow else (896, 4864, 14)

  def qwen2(L):
    return LlamaLikeConfig(arch="qwen2", vocab_size=151936, hidden_size=D,
                           intermediate_size=F, num_layers=L, num_heads=H, num_kv_heads=2,
                           head_dim=64, attention_bias=True, tie_word_embeddings=True,
                           max_position_embeddings=32768)

  cross = LlamaLikeConfig(arch="llama", vocab_size=32000, hidden_size=512,
                          intermediate_size=1536, num_layers=1, num_heads=8, num_kv_heads=2,
                          head_dim=64)
  return Setup(qwen2(2), qwen2(1), cross_draft=cross,
               target_name="D256 layers x2 (V 151936)" if narrow else "Qwen2.5-0.5B layers x2",
               draft_name="x1", cross_draft_name="llama V32000 x1")


def matrix_cells(methods=MATRIX_METHODS, topologies=MATRIX_TOPOLOGIES) -> list[tuple]:
  """(method, topology, sharded) of the matrix: every method on every topology, the one-device
  methods on one chip only."""
  return [(m, t, sh) for t, sh in topologies for m in methods
          if not (sh and m.split(":")[0] in ONE_DEVICE)]


def matrix_cell(method: str, setup: Setup, topology: str, sharded: bool, *, S: int = 256,
                step: TpuStep | None = None) -> dict:
  """Compile one cell (or read `step`, compiled) and report it: per chip the programs'
  argument bytes (weights, caches) and temporaries (`memory_analysis`), XLA's flops and bytes
  accessed of the step's programs as compiled (a loop body counted once), whether any CPU
  custom call reached the program, and the Mosaic calls in it."""
  if step is None:
    mesh = tpu_mesh(topology) if sharded else None
    step = lower_step(method, setup, topology=topology, S=S, mesh=mesh, compile=True)
  mem = [step.programs[n].compiled.memory_analysis() for n in step.step_programs]
  cost = [step.programs[n].compiled.cost_analysis() or {} for n in step.step_programs]
  text = "".join(step.programs[n].text for n in step.step_programs)
  return {"method": method, "topology": topology, "sharded": sharded,
          "chips": len(devices_of(topology)), "programs": list(step.step_programs),
          "argument_bytes": sum(m.argument_size_in_bytes for m in mem),
          "temp_bytes": max(m.temp_size_in_bytes for m in mem),
          "alias_bytes": sum(m.alias_size_in_bytes for m in mem),
          "flops": sum(float(c.get("flops", 0.0)) for c in cost),
          "bytes_accessed": sum(float(c.get("bytes accessed", 0.0)) for c in cost),
          "cpu_custom_calls": cpu_custom_calls(text),
          "mosaic_calls": text.count("tpu_custom_call")}


def render_matrix(rows: list[dict], setup: Setup, command: str = "") -> str:
  """The matrix as markdown: method x topology, per-chip MiB of arguments + temporaries, and
  the step's GFLOP and GB accessed (XLA's counts, a loop body once)."""
  tops = list(dict.fromkeys(r["topology"] for r in rows))
  cell = {(r["method"], r["topology"]): r for r in rows}
  lines = [f"Deviceless compiles ({setup.describe()}; B=1, S=256): each cell per chip "
           f"`arguments + temporaries MiB / GFLOP / GB accessed` of the step's programs "
           f"(XLA's cost analysis, a loop body once), `-`: not compiled (one device only).",
           "", f"`{command}`" if command else "", "",
           "| method | " + " | ".join(tops) + " |", "|---|" + "---|" * len(tops)]
  for m in dict.fromkeys(r["method"] for r in rows):
    out = []
    for t in tops:
      r = cell.get((m, t))
      if r is None:
        out.append("-")
      elif "error" in r:
        out.append("error")
      else:
        out.append(f"{(r['argument_bytes'] + r['temp_bytes']) / 2**20:,.0f} / "
                   f"{r['flops'] / 1e9:.2f} / {r['bytes_accessed'] / 1e9:.2f}")
    lines.append(f"| `{m}` | " + " | ".join(out) + " |")
  return "\n".join(lines) + "\n"
