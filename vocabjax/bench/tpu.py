"""Whole decoding steps of every method, compiled for TPUs on a host without one (libtpu's
compiler, `vocabjax.testing.tpu_aot`), and what the compiled programs say about a TPU.

Letters: B batch rows, S cache slots, T prompt block, V vocabulary, D hidden size.

    step = lower_step("chain_g3", Setup(target_cfg, draft_cfg), topology="v5e:1x1", S=1024,
                      compile=True)
    step.programs["step"].compiled.memory_analysis(), .cost_analysis()

The decoders are the library's own, built with abstract weights: the constructor runs under
`jax.make_jaxpr` on ShapeDtypeStructs (no weight is materialized; where it needs concrete
values, small stand-ins of the right shapes), and the programs come from the decoder's own
`lower()`, so what compiles here is what the decoder runs on a TPU. Decoders built inside
`tpu_tracing` are built for "tpu" (`lowering.platform_default`): their `Lowering` picks the
accelerator's paths (no CPU custom call); nothing reads or patches `jax.default_backend()`.
Memory, costs and projections: `vocabjax.bench.tpu_projection`, tables `vocabjax.bench.tpu_report`
(docs/tpu.md, 'Projections').
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
from vocabjax.bench.stand_ins import MethodSpec, Setup, abstract_models, method_spec
from vocabjax.sampling import SamplingParams
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import Lowering, decoding_lowering, loops_unrolled, platform_default
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.testing.tpu_aot import compile_failure, not_cached, tpu_devices

__all__ = ["CHIPS", "HBM_COST_OPTIONS", "Chip", "Program", "TpuStep", "build_decoder", "chip_of", "cpu_custom_calls",
           "devices_of", "lower_step", "platform_of", "tpu_mesh", "tpu_tracing"]

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
    return held_arrays(dec)

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


def held_arrays(dec, pred=None) -> dict:
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
  hbm_compiled: Any = None  # compiled with HBM_COST_OPTIONS, for its cost analysis only

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
    return sum(cache_bytes(c) for c in self.caches)

  def ring_bytes_per_chip(self) -> int:
    """Of those, the sliding layers' rings: a fixed size, not growing with the cache's slots."""
    return sum(cache_bytes(c) - cache_bytes(c, ring=False) for c in self.caches)

  def compile(self, names=None) -> "TpuStep":
    """Compile the programs (default: all), each program once per process and topology: two
    methods whose step is the same program (prompt lookup's, the n-gram table's and
    SuffixDecoding's chains verify host drafts of the same shapes) share one compile (the
    StableHLO text and the topology are the key); errors as `lower_step`'s."""
    for name in names or self.programs:
      prog = self.programs[name]
      if prog.compiled is None:
        prog.compiled = self._compiled(prog, "deviceless", name, {})
    return self

  def compile_hbm(self, names=None) -> "TpuStep":
    """Compile the programs (default: the cost programs) a second time with `HBM_COST_OPTIONS`,
    for the HBM bytes their cost analysis then counts (`hbm_costs`); cached as `compile`."""
    for name in names or self.cost_programs:
      prog = self.programs[name]
      if prog.hbm_compiled is None:
        prog.hbm_compiled = self._compiled(prog, "deviceless-hbm", name + " (HBM costs)",
                                           HBM_COST_OPTIONS)
    return self

  def _compiled(self, prog: Program, kind: str, label: str, options: dict):
    """`prog` compiled with `options`, once per process, topology and options (`kind`)."""
    key = ProgramKey(kind, hashlib.sha256(prog.text.encode()).hexdigest(), None,
                     (self.topology,), None)

    def build():
      with not_cached():  # a deviceless executable cannot be loaded back from the cache
        return guarded(self, label, lambda: prog.lowered.compile(compiler_options=options))

    return PROGRAMS.get(key, "deviceless", build)[0]

  def hbm_costs(self) -> dict:
    """{"flops", "bytes_accessed"} summed over the cost programs compiled with
    `HBM_COST_OPTIONS` (`compile_hbm`): the bytes the step moves to and from HBM, per chip."""
    self.compile_hbm()
    costs = [_cost(self.programs[n].hbm_compiled) for n in self.cost_programs]
    return {"flops": sum(float(c.get("flops", 0.0)) for c in costs),
            "bytes_accessed": sum(float(c.get("bytes accessed", 0.0)) for c in costs)}


# XLA:TPU's cost analysis counts bytes in every memory space: a weight that memory-space
# assignment prefetches into VMEM is counted three times (the copy's HBM read, its VMEM write,
# the consumer's VMEM read) for one HBM read (Llama-3.1-8B's plain step on one v5p chip: 21.19
# GB accessed for 16.19 GB of arguments, 4.39 GB of it the prefetches' writes), and a
# cross-program prefetch copies a whole parameter into VMEM for a consumer that reads a few of
# its rows (an embedding table for a 2-token lookup: 272 MB counted for 68 MB of table, 0.05 MB
# without it). Compiled with both kinds of prefetch off, the consumers read their operands
# from HBM and XLA's count is the step's HBM traffic, nothing kept in VMEM between steps (the
# same plain step: 15.71 GB, the arguments less the embedding table, of which one row is
# read). The cost programs are compiled this way a second time for that count only; the
# programs a TPU would run are compiled as they are.
HBM_COST_OPTIONS = {"xla_tpu_msa_inefficient_use_to_copy_ratio": 1e9,
                    "xla_max_cross_program_prefetches": 0}


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis() or {}
  return cost[0] if isinstance(cost, list) else cost


def cache_bytes(cache, ring: bool = True) -> int:
  """Bytes per chip of a KV cache's buffers (a sliding layers' ring included unless `ring` is
  False)."""
  return sum(bytes_per_chip(x) for name, x in cache.kv_arrays().items()
             if ring or not name.endswith("_local"))


def kv_bytes_per_slot_per_chip(config: LlamaLikeConfig, dtype, mesh) -> int:
  """One layer's K (or V) bytes per cache slot and row on one chip (KV heads split over
  "model" when they divide it, as `sharding.cache_specs`)."""
  heads = config.num_kv_heads
  if mesh is not None and heads % mesh.shape["model"] == 0:
    heads //= mesh.shape["model"]
  return heads * config.head_dim * jnp.dtype(dtype).itemsize


def kv_bytes_per_chip(config: LlamaLikeConfig, B: int, S: int, dtype, mesh) -> int:
  """Bytes on one chip of the KV cache `KVCache.init(config, B, S)` makes (its sliding layers
  in a ring past their window), without making it."""
  shapes = jax.eval_shape(lambda: KVCache.init(config, B, S, dtype))
  slots = sum(int(np.prod(x.shape[:3])) for x in shapes.kv_arrays().values())
  return slots * kv_bytes_per_slot_per_chip(config, dtype, mesh)


def bytes_per_chip(x) -> int:
  """Bytes of `x`'s shard on one chip; sub-byte dtypes (int4 codes) packed, as HBM holds them
  (numpy's itemsize of int4 is a whole byte)."""
  shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
  bits = jnp.iinfo(x.dtype).bits if jnp.issubdtype(x.dtype, jnp.integer) else (
      8 * jnp.dtype(x.dtype).itemsize)
  return (int(np.prod(shape, dtype=np.int64)) * bits + 7) // 8


def guarded(step_or_where, name: str, fn):
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
    decoder = guarded(where, "decoder", lambda: build_decoder(
        method, setup, device=None if mesh is not None else device, mesh=mesh,
        platform=platform))
  unrolled_dec = None
  if costs and spec.loops:  # the same decoder with its drafting loops traced unrolled
    with loops_unrolled(spec.while_trips):
      unrolled_dec = guarded(where, "decoder (loops unrolled)", lambda: build_decoder(
          method, setup, device=None if mesh is not None else device, mesh=mesh,
          platform=platform))
  with tpu_tracing(device, mesh, platform):
    step = guarded(where, "step", lambda: _lower(method, decoder, setup, B, S, T, device,
                                                  mesh, prefill, sampling, topology))
    step.spec = spec
    if unrolled_dec is not None:
      with loops_unrolled(spec.while_trips):
        unrolled = guarded(where, "step (loops unrolled)", lambda: _lower(
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
