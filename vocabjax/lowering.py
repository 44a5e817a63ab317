"""How a traced program lowers its projections, top-k and cache writes: one static value.

The same model code compiles differently in different programs (a decoding step's projections
through the CPU kernel for blocks of any size, a bf16 model's prefill through the bf16 GEMM, top-k
as argmax rounds and row-by-row cache writes on a mesh, bf16 products in mixed-precision
training). `Lowering` names all of these:

    Lowering(platform, cpu_kernel, any_rows, bf16_blocks, bf16_dots, split_top_k,
             block_top_k, row_writes, sum_attention)

A traced function takes a `lowering` as a static argument (part of the compiled program's
identity) and puts it into its params (`with_lowering`); model code reads it back with
`lowering_of(params)`. `Lowering` is a static pytree node in the params' treedef, so jit's cache
key and an AOT program's input check include it. A decoder fixes its lowering when built
(`decoding_lowering`; `platform` from its mesh's devices, else the default backend, or
`platform_default` for deviceless builds), never from `jax.default_backend()` while tracing.
Untagged params lower with `Lowering()`: platform left to where the program lowers, the CPU
kernel for blocks of at most `cpu_matmul.MAX_ROWS` rows (unless `VOCABJAX_CPU_KERNEL=0` at
import), all else off. docs/engine.md, 'CPU speed' ('How a program chooses').
"""

from __future__ import annotations

import contextlib
import functools
import dataclasses
import os

import jax

KEY = "lowering"  # the params key a traced function's lowering travels under


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Lowering:
  """The static choices a traced program makes below the model code."""

  platform: str = ""
  """The platform the program is built for: "cpu", "gpu" or "tpu" (a decoder's, fixed when it
  is built); "": decided where the program is lowered (`jax.lax.platform_dependent`)."""
  cpu_kernel: bool = os.environ.get("VOCABJAX_CPU_KERNEL", "1") != "0"
  """XLA:CPU: projections of blocks of <= MAX_ROWS rows through the streaming C++ kernel
  (`vocabjax.kernels.cpu_matmul`); off: XLA's dot. No effect on GPU and TPU."""
  any_rows: bool = False
  """The kernel for blocks of any size (decoding steps: a verified batch block can outgrow
  MAX_ROWS, and its logits must keep a one-token step's rounding)."""
  bf16_blocks: bool = False
  """Blocks of >= GEMM_MIN_ROWS rows through the CPU's bf16 GEMM (x rounded to bf16): a bf16
  model's prompt prefill, a drafter's prefill. Not exact f32 arithmetic."""
  bf16_dots: bool = False
  """Every projection as mixed-precision training computes it (`cpu_matmul.bf16_dot`): both
  operands rounded to bf16, f32 accumulation. Training only."""
  split_top_k: bool = False
  """top-k (k <= 16) as k rounds of argmax: partitioned over a vocabulary split by a mesh,
  where XLA's TopK gathers every row to every device."""
  block_top_k: int = 0
  """A drafting top-k over more than 2x this many entries (the vocabulary) in two stages: the
  top-k of each block of this many, then of the blocks' winners (the same values and indices,
  ties at the lower index). XLA:TPU sorts a whole row for a top-k: a tree level's over 152K-262K
  logits takes 5-7 s to compile alone, the two-stage form under 1 s
  (kernels/results/tpu_topk). 0: one top-k."""
  row_writes: bool = False
  """A batch's cache writes (and a tree's path compaction) as one update per row: on a mesh
  the batched scatter is replicated."""
  model_shards: int = 1
  """Chips the mesh's "model" axis splits a vocabulary over (0: a mesh of unknown shape): an
  int8 embedding's lookups take whole 32-row tiles only where each chip's rows are whole tiles
  (`kernels.gather.take_rows`)."""
  mesh: object = None
  """The mesh a decoder's programs run on (None: one device): kernels that are one device's
  program (grouped int4 on a TPU) run under `shard_map` over it."""
  sum_attention: bool = os.environ.get("VOCABJAX_SUM_ATTENTION", "0") == "1"
  """Attention over the cache as products summed (not einsum's dots), each layer's output tied
  to the caches by an optimization barrier before the next layer writes: compiled by XLA:GPU,
  the step then writes one cache slot per layer in place instead of copying and transposing
  the whole stacked cache four times (kernels/results/gpu_cache_traffic/). Off by default
  until a GPU run has timed it and passed the exactness tests with it
  (`VOCABJAX_SUM_ATTENTION=1` when vocabjax is imported, or `sum_attention_default`)."""

  layer_loop: bool = os.environ.get("VOCABJAX_LAYER_LOOP", "1") != "0"
  """XLA:CPU with the kernel on: a decoder whose layers are GGUF blocks runs them as one loop
  body (`models.llamalike`, `loops_layers`) with the layer an operand of the kernels, instead of
  every layer unrolled into each program's code: each compiled program holds about a third of
  the resident memory (kernels/results/layer_loop/), the same bits. Off
  (`VOCABJAX_LAYER_LOOP=0` when vocabjax is imported): unrolled, as other weights always are."""

  unroll_loops: bool = False
  """For cost analysis only (`vocabjax.bench.tpu`): the drafting loops traced unrolled (a scan
  fully, a bounded while loop as `while_trips` calls of its body; `scan` / `while_loop`
  below), since XLA's cost analysis counts a loop body once whatever its trip count."""
  while_trips: int = 0
  """With `unroll_loops`: the iterations a drafting while loop is traced as (exact for the
  cross-vocabulary drafter without an acceptance head: it always runs gamma - 1)."""

  def replace(self, **changes) -> "Lowering":
    return dataclasses.replace(self, **changes)


# read by decoding_lowering only, never while tracing; starts from the environment's defaults
_process = {key: getattr(Lowering(), key) for key in ("cpu_kernel", "sum_attention")}
_process["platform"] = ""  # "": the default backend (`platform_default` sets another)
_process["unroll"] = (False, 0)  # (unroll_loops, while_trips): `loops_unrolled`


def with_lowering(params: dict, lowering: Lowering) -> dict:
  """A shallow copy of `params` that lowers with `lowering` (inside a traced function)."""
  if not isinstance(lowering, Lowering):
    raise TypeError(f"with_lowering: expected a Lowering, got {type(lowering).__name__}")
  return {**params, KEY: lowering}


def lowering_of(params) -> Lowering:
  """The lowering `params` carry (`Lowering()` when untagged)."""
  got = params.get(KEY) if isinstance(params, dict) else None
  return got if got is not None else Lowering()


def decoding_lowering(*, mesh, cpu_kernel: bool | None = None,
                      platform: str | None = None) -> Lowering:
  """A decoder's base lowering, for `platform` (None: `target_platform(mesh)`): the CPU kernel
  on a CPU unless on a mesh (the kernel is one device's custom call; GSPMD would gather the
  weights to it) or switched off; on a mesh (`mesh`: a Mesh, or True), top-k as argmax rounds
  and per-row cache writes; on TPU, drafting top-ks in two stages. Its step programs add
  `any_rows` (off a mesh), its prefills `bf16_blocks` where the model's weights are bf16."""
  on_mesh = mesh is not None and mesh is not False
  platform = platform or target_platform(mesh if on_mesh and mesh is not True else None)
  kernel = _process["cpu_kernel"] if cpu_kernel is None else bool(cpu_kernel)
  unroll, trips = _process["unroll"]
  return Lowering(platform=platform, cpu_kernel=kernel and not on_mesh and platform == "cpu",
                  split_top_k=on_mesh, row_writes=on_mesh,
                  model_shards=(1 if not on_mesh else mesh.shape["model"]
                                if hasattr(mesh, "shape") else 0),
                  mesh=mesh if on_mesh and hasattr(mesh, "shape") else None,
                  sum_attention=_process["sum_attention"],
                  block_top_k=TPU_TOP_K_BLOCK if platform == "tpu" else 0,
                  unroll_loops=unroll, while_trips=trips)


TPU_TOP_K_BLOCK = 4096  # Lowering.block_top_k where the decoders run on TPU


def target_platform(mesh=None) -> str:
  """The platform a decoder built now compiles for: its mesh's devices' platform, else the
  process's (`platform_default`), else JAX's default backend. Read when a decoder is built,
  never while tracing."""
  if mesh is not None:
    return next(iter(mesh.devices.flat)).platform
  return _process["platform"] or jax.default_backend()


def platform_default(platform: str):
  """`with platform_default("tpu"):` decoders constructed inside compile for TPU (their layout,
  kernel and top-k choices), whatever this host's backend: deviceless compilation
  (`vocabjax.bench.tpu`)."""
  if platform not in ("cpu", "gpu", "tpu"):
    raise ValueError(f"platform {platform!r}: choose 'cpu', 'gpu' or 'tpu'")
  return _process_default("platform", platform)


def step_lowering(base: Lowering) -> Lowering:
  """`base` for a decoding step: the kernel for blocks of any size where the kernel is on."""
  return base.replace(any_rows=base.cpu_kernel)


def set_default_cpu_kernel(on: bool) -> None:
  """Whether decoders built from now on use the CPU kernel (`VOCABJAX_CPU_KERNEL` at import
  sets the initial value)."""
  _process["cpu_kernel"] = bool(on)


def default_cpu_kernel() -> bool:
  return _process["cpu_kernel"]


@contextlib.contextmanager
def _process_default(key: str, value):
  old = _process[key]
  _process[key] = value if key == "platform" else bool(value)
  try:
    yield
  finally:
    _process[key] = old


def cpu_kernel_default(on: bool):
  """`with cpu_kernel_default(False):` decoders constructed inside compile with XLA's dot."""
  return _process_default("cpu_kernel", on)


def lowered(fn, lowering: Lowering, argnums=(0,)):
  """`fn` with its params arguments at positions `argnums` tagged with `lowering` when it runs
  (inside the trace): what a decoder jits, so the lowering is fixed where the program is
  compiled."""
  argnums = tuple(argnums)

  @functools.wraps(fn)
  def run(*args, **kwargs):
    args = list(args)
    for i in argnums:
      args[i] = with_lowering(args[i], lowering)
    return fn(*args, **kwargs)

  # the program's name (jit(chain_step), not jit(run)) in logs, profiles and HLO dumps
  run.__name__ = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None),
                                                          "__name__", "run")
  return run


def sum_attention_default(on: bool):
  """`with sum_attention_default(True):` decoders constructed inside attend by summed products
  (`Lowering.sum_attention`)."""
  return _process_default("sum_attention", on)


@contextlib.contextmanager
def loops_unrolled(while_trips: int = 0):
  """`with loops_unrolled(n):` decoders constructed inside trace their drafting loops unrolled
  (`Lowering.unroll_loops`, a while loop as n calls of its body): for cost analysis, never to
  run."""
  old = _process["unroll"]
  _process["unroll"] = (True, int(while_trips))
  try:
    yield
  finally:
    _process["unroll"] = old


def scan(f, init, xs, lowering: Lowering):
  """`jax.lax.scan(f, init, xs)`, fully unrolled where `lowering.unroll_loops`."""
  return jax.lax.scan(f, init, xs, unroll=True if lowering.unroll_loops else 1)


def while_loop(cond, body, init, lowering: Lowering):
  """`jax.lax.while_loop(cond, body, init)`; where `lowering.unroll_loops`, `body` called
  `lowering.while_trips` times instead (`cond` unread: for a loop of known trips)."""
  if not lowering.unroll_loops:
    return jax.lax.while_loop(cond, body, init)
  carry = init
  for _ in range(lowering.while_trips):
    carry = body(carry)
  return carry
