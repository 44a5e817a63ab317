"""What a method's compiled TPU step says about a TPU: memory against the chip's HBM, XLA's
costs, the roofline time and PROJECTED speedups (`project`, `python -m vocabjax.bench tpu`),
and the matrix of every method's step on every generation (`matrix_cell`). The steps are
`vocabjax.bench.tpu`'s; the tables `vocabjax.bench.tpu_report`'s.

`project` compiles each method's step for a topology (one
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

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.bench.stand_ins import (HOST_ONLY, METHODS, MethodSpec, Setup,
                                      abstract_dflash_config, abstract_head_config, method_spec)
from vocabjax.bench.tpu import (GiB, Chip, TpuStep, build_decoder, bytes_per_chip, cache_bytes,
                                chip_of, cpu_custom_calls, devices_of, held_arrays,
                                platform_of,
                                kv_bytes_per_chip, lower_step, tpu_mesh, tpu_tracing)
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.testing.tpu_aot import tpu_devices
from vocabjax.vocab.policy import POLICY_STATE
from vocabjax.vocab.ranked import SpeculativeVocab

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
    given = {k: v for k, v in e["params"].items() if k not in HOST_ONLY}
    full = {**defaults, **given}
    if (all(full.get(k) == v for k, v in spec.params.items())
        and all(v == defaults.get(k) for k, v in given.items() if k not in spec.params)):
      return e
  return None


def _weight_bytes_per_chip(dec) -> int:
  """Bytes per chip of every array a decoder holds (weights, attached policies, id maps), each
  array once: the engine's `_states` (the loop state's shapes by request shape) holds the same
  params again beside abstract caches, which are not weights."""
  seen, total = set(), 0
  for name, v in held_arrays(dec, _traced_abstract).items():
    if name == "_states":
      continue
    for x in jax.tree.leaves(v):
      if id(x) not in seen:
        seen.add(id(x))
        total += bytes_per_chip(x)
  return total


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
  kv_ar = kv_bytes_per_chip(setup.target, B, S, setup.dtype, mesh)
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
                      **_head_of(setup),
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
    except (AssertionError, ValueError) as e:  # guarded's (the method, program and shapes,
      # then XLA's lines), or a decoder refusing the setup (an EAGLE head over an int8 target)
      row["error"] = str(e) if isinstance(e, AssertionError) else f"{spec.name}: {e}"
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
  # HBM traffic: the cost programs compiled once more with VMEM prefetches priced out
  # (`tpu.HBM_COST_OPTIONS`); a GPU's count has no such copies
  with tpu_tracing(device, mesh):
    hbm = step.hbm_costs()["bytes_accessed"] if platform_of(topology) == "tpu" else bytes_
  t_flops, t_bytes = flops / chip.bf16_flops_per_s, hbm / chip.hbm_bytes_per_s
  ring = step.ring_bytes_per_chip()  # sliding layers' rings: fixed, whatever the slots
  per_slot = (kv - ring) / S
  row = {"programs": list(step.step_programs), "cost_programs": list(step.cost_programs),
         "weights_bytes": args - kv, "kv_bytes": kv, "temp_bytes": temps,
         "total_bytes": total, "hbm_bytes": chip.hbm_bytes, "fits": total <= chip.hbm_bytes,
         "kv_bytes_per_slot": per_slot, "kv_ring_bytes": ring,
         "max_cache_slots": (int((chip.hbm_bytes - (total - (kv - ring))) // per_slot)
                             if per_slot else None),
         "model_max_positions": setup.target.max_position_embeddings,
         "flops": flops, "bytes_accessed": bytes_, "hbm_bytes_accessed": hbm,
         "roofline_s": max(t_flops, t_bytes),
         "bound": "memory" if t_bytes >= t_flops else "compute",
         # every argument (weights, caches) read once: exact HBM traffic for a one-pass step,
         # a floor for one whose drafter or head runs several times
         "args_floor_s": args / chip.hbm_bytes_per_s,
         "drafter_passes": drafter_passes(spec, dec)}
  stream = stream_bytes(spec, step)
  kernel_bytes = pallas_bytes(spec, setup, B, dec)
  row["stream_bytes"] = stream
  # what XLA's HBM count reads and writes over what the step must read (the weight-stream
  # model); Pallas kernels' reads are in neither count's XLA part
  row["bytes_ratio"] = hbm / (stream - (kernel_bytes or 0))
  row["stream_s"] = max(flops / chip.bf16_flops_per_s, stream / chip.hbm_bytes_per_s)
  pallas = sum(step.programs[n].text.count("tpu_custom_call") for n in step.step_programs)
  if pallas:
    row["pallas_calls_lowered"] = pallas
    row["pallas_bytes_not_counted"] = kernel_bytes
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
  `pallas_bytes`)."""
  dec, setup = step.decoder, step.setup
  passes = drafter_passes(spec, dec)
  target = getattr(dec, "params", None) or dec.target_params
  total = cache_bytes(step.caches[0])
  total += sum(passes * cache_bytes(c) for c in step.caches[1:])
  tied_target = setup.target.tie_word_embeddings
  for key, tree in target.items():
    if key != "embed" or tied_target:
      total += sum(bytes_per_chip(x) for x in jax.tree.leaves(tree))
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
      total += passes * sum(bytes_per_chip(x) for x in jax.tree.leaves(tree))
  return total + (pallas_bytes(spec, setup, step.B, dec) or 0)


def pallas_bytes(spec, setup, B, dec=None) -> int | None:
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


# --- the matrix: every method's step on every generation, one chip and a slice ----------------

# one chip of each generation, and a 4-chip slice of each with the model axis over its chips
MATRIX_TOPOLOGIES = (("v5e:1x1", False), ("v6e:1x1", False), ("v5p:1x1x1", False),
                     ("v5e:2x2", True), ("v6e:2x2", True), ("v5p:2x2x1", True))
# every registered method's step, with each drafter vocabulary policy where it applies (full,
# a static subset: VocabTrim and FR-Spec run one program, SpecVocab's ranker with the Mosaic
# kernel; each policy on a chain: a tree under a policy runs the same policy per level, and
# costs 4-9 s more a topology to compile), in the registry's names; `ONE_DEVICE` methods
# (their trees are the host's, merged into a head's) on one chip only
# (trees of 2 levels: every level is the same program part, and each costs the compile seconds
# of a top-k over the vocabulary; prompt lookup's, the n-gram table's and SuffixDecoding's
# chains of 4 are one program, compiled once)
MATRIX_METHODS = (
    "ar", "chain:gamma=3", "vocabtrim:k=8192,gamma=3", "specvocab:k=2048,gamma=3",
    "microspec:core=512,window=2560,gamma=3", "slimspec:gamma=3", "dynaspec:top=4,gamma=3",
    "evospec:base=8192,window=1024,gamma=3",
    "tree:top_k=2,depth=2,total_tokens=4", "pld:gamma=4",
    "pld:gamma=4,candidates=2", "ngram:gamma=4", "suffix:max_spec_tokens=4",
    "suffix:max_spec_tokens=4,use_tree=true", "eagle:top_k=1,depth=3,total_tokens=3",
    "eagle:top_k=2,depth=2,total_tokens=4", "eagle_pld:top_k=2,depth=2,total_tokens=4",
    "eagle_suffix:top_k=2,depth=2,total_tokens=4,max_spec_tokens=4", "medusa:top_k=2,depth=2",
    "crossvocab:gamma=4", "tree_suffix:top_k=2,depth=2,total_tokens=4,max_spec_tokens=4",
    "dflash", "dflash|subset_k=8192", "dflash:ranker=x,k=2048", "dflash|version=2",
    "dflash:ranker=x,k=2048|version=2", "dflash|tree=2x3", "peagle:gamma=4",
    "peagle:gamma=4,lm_head=target|subset_k=8192")
ONE_DEVICE = ("eagle_pld", "eagle_suffix", "tree_suffix")
# the weight-only int8 cells (`Setup.weights`): plain decoding, a chain and a tree, a static
# subset over an int8 drafter's rows, on every topology of the matrix
QUANTIZED_METHODS = ("ar", "chain:gamma=3", "tree:top_k=2,depth=2,total_tokens=4",
                     "vocabtrim:k=8192,gamma=3")


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


def _head_of(setup) -> dict:
  """The setup's head as the report names it: an EAGLE head's kind, Vd and MLP width, or a
  paper's DFlash drafter's layers and the target layers it reads."""
  if setup.head_kind == "dflash":
    ids = abstract_dflash_config(setup, block=2).target_layer_ids  # the block: no bearing
    return {"dflash_drafter": {"layers": setup.head_layers, "target_layer_ids": list(ids),
                               "intermediate": setup.head_intermediate}}
  return {"eagle_head": {"kind": setup.head_kind,
                         "draft_vocab": abstract_head_config(setup).draft_vocab_size,
                         "intermediate": setup.head_intermediate}}
