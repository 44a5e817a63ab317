"""Placing a model on a device mesh: tensor-parallel heads/MLP, vocab-split LM head, data-parallel batch.

Mesh axes: "data" (batch rows) and "model" (tensor parallel). Rules, Megatron style (weights
are [out, in]):
  wq/wk/wv [heads*d, D]     split the output (head) axis over "model"
  wo       [D, heads*d]     split the input (head) axis; XLA inserts the all-reduce
  w_gate/w_up [F, D]        split F;  w_down [D, F] split F
  embed, lm_head [V, D]     split V (the LM head's logits come out vocab-sharded)
  KV cache [L, B, S, K, d]  B over "data", K over "model"
Attention is split by whole KV-head groups: wq/bq/wk/wv/bk/bv/wo (and the cache's K axis) only
when the KV heads divide by the model axis (then each device holds whole groups of query heads
with their KV head); otherwise all of attention is replicated (e.g. Qwen2.5-1.5B's 2 KV heads on
a 4- or 8-way axis) and only the MLP and vocabulary split. Splitting the flat
[heads * head_dim] axis across a head made every reshape to [heads, head_dim], RoPE's half
rotation and the cache write reshard inside the step (measured: 621 all-gathers, 684
collective-permutes and 86 all-to-alls per chain step, `kernels/sharded_step.py`); splitting
query heads over a replicated cache made XLA split the cache by KV head inside the step and
gather it whole at its end. Any other dimension that does not divide by its mesh axis is
replicated too, so every mesh shape works. The forward and decode functions are unchanged:
`jax.jit` partitions them (GSPMD) from the input shardings; the KV cache is written one
dynamic-update-slice per row (`models.llamalike.write_block`) so that a batch split over "data"
stays split. Multi-host: call
`jax.distributed.initialize()` first; `make_mesh` then spans every process's devices.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.kernels.blocks import BlockWeight, GroupedInt4, is_blocks
from vocabjax.lowering import target_platform
from vocabjax.models.llamalike import SCALE, is_int8, param_shapes

# leaf -> which axis of the per-layer tensor goes to "model".
_LAYER_MODEL_AXIS = {"wq": 0, "wk": 0, "wv": 0, "bq": 0, "bk": 0, "bv": 0, "wo": 1,
                     "w_gate": 0, "w_up": 0, "w_down": 1}
_ATTENTION = ("wq", "bq", "wk", "wv", "bk", "bv", "wo")  # split only by whole KV-head groups


def make_mesh(data: int = 1, model: int | None = None, devices=None) -> Mesh:
  """A ("data", "model") mesh; `model` defaults to all devices not used by `data`."""
  devices = list(jax.devices() if devices is None else devices)
  if model is None:
    model = len(devices) // data
  if data * model != len(devices):
    raise ValueError(f"mesh {data=} x {model=} does not match {len(devices)} devices")
  return Mesh(np.array(devices).reshape(data, model), ("data", "model"))


def parse_mesh(text: str) -> dict:
  """`data=D,model=M` (either may be left out: data defaults to 1, model to the remaining
  devices) -> make_mesh's keyword arguments; ValueError naming the bad part."""
  out = {}
  for part in text.split(","):
    name, eq, value = part.strip().partition("=")
    if not eq or name not in ("data", "model") or not value.isdigit() or int(value) < 1:
      raise ValueError(f"mesh {text!r}: expected data=D,model=M with positive integers, "
                       f"got {part!r}")
    if name in out:
      raise ValueError(f"mesh {text!r} names {name} twice")
    out[name] = int(value)
  return out


def _spec(shape: tuple, axis: int | None, mesh: Mesh, name: str = "model") -> P:
  parts = [None] * len(shape)
  if axis is not None and shape[axis] % mesh.shape[name] == 0:
    parts[axis] = name
  return P(*parts)


def param_specs(config: LlamaLikeConfig, mesh: Mesh) -> dict:
  """PartitionSpec for every param leaf (same tree as `init_params`)."""
  shapes = param_shapes(config)
  specs = {k: _spec(shapes[k], 0, mesh) for k in ("embed", "lm_head") if k in shapes}
  specs["final_norm"] = P()
  specs["layers"] = [{leaf: _spec(shape, _layer_axis(leaf, config, mesh), mesh)
                      for leaf, shape in layer.items()} for layer in shapes["layers"]]
  return specs


def _layer_axis(leaf: str, config: LlamaLikeConfig, mesh: Mesh) -> int | None:
  """The axis a decoder layer's leaf is split on over "model" (None: replicated)."""
  if leaf in _ATTENTION and config.num_kv_heads % mesh.shape["model"]:
    return None  # would split a KV-head group: replicate (module doc)
  return _LAYER_MODEL_AXIS.get(leaf)


def param_shardings(config: LlamaLikeConfig, mesh: Mesh) -> dict:
  """The NamedSharding of every param leaf on `mesh` (`param_specs`): where `shard_params`
  puts a model, and where `load_model(..., mesh=mesh)` places each tensor as it is read."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(config, mesh),
                      is_leaf=lambda x: isinstance(x, P))


def shard_params(params: dict, config: LlamaLikeConfig, mesh: Mesh) -> dict:
  """device_put every leaf with its NamedSharding (int8 rows' scales: `with_scale_specs`)."""
  if any(isinstance(x, BlockWeight) for x in jax.tree.leaves(params, is_leaf=is_blocks)):
    raise ValueError("GGUF blocks are a one-device option (the CPU kernel's); shard the model "
                     "in float32, bfloat16, int8 (dtype='int8': per-row int8, split as its "
                     "matrices) or int4 (dtype='int4' with the mesh: grouped int4)")
  specs = param_specs(config, mesh)
  if is_int8(params):
    specs = with_scale_specs(specs, params)

  cpu = target_platform(mesh) == "cpu"

  def put(x, spec):
    if isinstance(x, GroupedInt4):
      codes = x.codes
      if cpu and codes.dtype == jnp.int4:
        # XLA:CPU's programs over several devices take int4 arguments packed, but jax hands
        # them over unpacked and refuses the call (jax 0.10.2: "compiled for input layouts that
        # disagree ... sub_byte_element_size_in_bits=4"); the same codes in int8 there
        codes = codes.astype(jnp.int8)
      specs = grouped_specs(x, spec, mesh)
      split = "in" if specs[0][0] is not None else "out" if specs[0][1] is not None else None
      return GroupedInt4(*(jax.device_put(a, NamedSharding(mesh, s))
                           for a, s in zip((codes, x.scales), specs)), split=split)
    return jax.device_put(x, NamedSharding(mesh, spec))

  return jax.tree.map(put, params, specs, is_leaf=is_blocks)


def grouped_specs(w: GroupedInt4, spec: P, mesh: Mesh) -> tuple[P, P]:
  """The specs of a grouped int4 weight's codes [D, F] and scales [D / 32, F] for the spec of
  its float matrix [F, D]: the same axes, transposed; a split of D over more devices than its
  groups divide into leaves D whole (replicated), as a float matrix whose axis does not divide
  is."""
  parts = (tuple(spec) + (None, None))[:2]
  rows, cols = parts
  G = w.scales.shape[0]
  if cols is not None and G % mesh.shape[cols]:
    cols = None
  return P(cols, rows), P(cols, rows)


def with_scale_specs(specs: dict, params: dict) -> dict:
  """`specs` with a spec for every int8 matrix's per-row scales (`llamalike.SCALE`): split over
  "model" where the matrix's rows are (a column-parallel matrix, the vocabulary-split
  embedding), else replicated (a row-parallel matrix's scales multiply its all-reduced
  outputs). int8 matrices are [out, in] whatever the float model's MLP layout."""
  def of(spec_dict, leaves):
    out = dict(spec_dict)
    for name in leaves:
      if name.endswith(SCALE):
        base = out[name[:-len(SCALE)]]
        out[name] = P(base[0]) if len(base) and base[0] is not None else P()
    return out

  specs = of(specs, params)
  specs["layers"] = [of(ls, lp) for ls, lp in zip(specs["layers"], params["layers"])]
  return specs


def cache_specs(config: LlamaLikeConfig, batch_size: int, mesh: Mesh,
                ring: bool = False) -> KVCache:
  """The cache's PartitionSpecs (`ring`: it has sliding layers' rings, `models.cache`)."""
  kv = P(None, "data" if batch_size % mesh.shape["data"] == 0 else None, None,
         "model" if config.num_kv_heads % mesh.shape["model"] == 0 else None, None)
  rows = P("data" if batch_size % mesh.shape["data"] == 0 else None)
  # every layer sliding (Mistral) with rings: the global buffers hold no layer; XLA returns an
  # empty array replicated whatever it was given, so it is placed replicated to begin with
  empty = ring and all(map(config.is_sliding, range(config.num_layers)))
  glob = P() if empty else kv
  return KVCache(k=glob, v=glob, lengths=rows, **(dict(k_local=kv, v_local=kv) if ring else {}))


def cache_shardings(cache: KVCache, mesh: Mesh) -> KVCache:
  """The NamedShardings `cache_specs` gives a cache of these shapes (read from the shapes alone:
  rows over "data", KV heads over "model" where they divide; empty global buffers of an
  all-sliding model replicated), for a cache whose config is not at hand (a loop state's)."""
  B, N = cache.lengths.shape[0], cache.k.shape[3]
  data = "data" if B % mesh.shape["data"] == 0 else None
  kv = NamedSharding(mesh, P(None, data, None, "model" if N % mesh.shape["model"] == 0
                             else None, None))
  ring = cache.k_local is not None
  glob = NamedSharding(mesh, P()) if ring and cache.k.shape[0] == 0 else kv
  return KVCache(k=glob, v=glob, lengths=NamedSharding(mesh, P(data)),
                 **(dict(k_local=kv, v_local=kv) if ring else {}))


def shard_cache(cache: KVCache, config: LlamaLikeConfig, mesh: Mesh) -> KVCache:
  specs = cache_specs(config, cache.batch_size, mesh, ring=cache.k_local is not None)
  return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), cache, specs)


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, P())


def replicate(tree, mesh: Mesh):
  """`tree`'s leaves copied to every device of `mesh` (small arrays: a policy's ids and rows,
  a head drafter's weights)."""
  return jax.tree.map(lambda x: jax.device_put(x, replicated(mesh)), tree)


def shard_rows(x: jax.Array, mesh: Mesh) -> jax.Array:
  """A [V, D] table (an embedding or LM head a head drafter shares with its target) split by
  rows over "model" as the target's is (replicated if V does not divide)."""
  return jax.device_put(x, NamedSharding(mesh, _spec(x.shape, 0, mesh)))


def shard_layer(layer: dict, config: LlamaLikeConfig, mesh: Mesh) -> dict:
  """One decoder layer's leaves placed by the model's rules (`param_specs`: attention by whole
  KV-head groups, the MLP by its intermediate axis; norms and leaves the rules do not name,
  such as an [in, out] MLP's `*_t`, replicated): a head drafter's layer (EAGLE's) split as
  its target's layers are, so each chip streams its share of it per drafting call."""
  def place(leaf, x):
    return jax.device_put(x, NamedSharding(mesh, _spec(x.shape, _layer_axis(leaf, config, mesh),
                                                       mesh)))

  return {leaf: place(leaf, x) for leaf, x in layer.items()}


def place_policy(state: dict, mesh: Mesh) -> dict:
  """A vocabulary policy's arrays on a mesh: a trimmed head's rows (and their ids and int8
  scales: [K, ...]) split by rows over "model" as the full head's are (replicated, each chip
  would read all K rows every drafting call: on a 4-chip slice a 64K subset read more per chip
  than the 128K head it trims), a ranker's matrices replicated (`SpeculativeVocab.attach`
  shards its indexed head itself)."""
  return {k: shard_rows(v, mesh) if k in ("head", "ids", "scale") else replicate(v, mesh)
          for k, v in state.items()}


def shard_batch(x: jax.Array, mesh: Mesh) -> jax.Array:
  """Place a [B, ...] array with its rows over "data" (replicated if B does not divide)."""
  spec = P("data") if x.shape[0] % mesh.shape["data"] == 0 else P()
  return jax.device_put(x, NamedSharding(mesh, spec))


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
          "s64": 8, "f64": 8}


def collectives(hlo: str) -> dict:
  """{op: (count, result bytes)} of the collectives in compiled HLO text (async pairs counted
  once, at their -start): what a partitioned program communicates (`kernels/sharded_step.py`,
  and the tests that a sharded decoding step does not reshard)."""
  out = {op: [0, 0] for op in COLLECTIVES}
  shape = re.compile(r"(\w+)\[([\d,]*)\]")
  for line in hlo.splitlines():
    m = re.search(r"=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
    if not m or "-done" in line.split("=")[0]:
      continue
    op, result = m.group(2), m.group(1)
    nbytes = 0
    for dt, dims in shape.findall(result):
      n = 1
      for d in filter(None, dims.split(",")):
        n *= int(d)
      nbytes += n * _BYTES.get(dt, 4)
    if m.group(3):  # an async start's result tuple holds the operand and the result
      nbytes //= 2
    out[op][0] += 1
    out[op][1] += nbytes
  return {k: tuple(v) for k, v in out.items() if v[0]}
