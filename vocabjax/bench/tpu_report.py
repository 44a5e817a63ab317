"""The tables of `vocabjax.bench.tpu_projection`'s results, as markdown: a projection's
(`render`), with what a compiled program's costs cannot see (`CANNOT_SEE`), and the TPU
matrix's (`render_matrix`)."""

from __future__ import annotations

from vocabjax.bench.stand_ins import Setup
from vocabjax.bench.tpu import GiB

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
    "XLA:TPU's `bytes accessed` as compiled counts every memory space: a weight its "
    "memory-space assignment prefetches into VMEM is counted three times (the copy's HBM read, "
    "its VMEM write, the consumer's VMEM read) for one HBM read (Llama-3.1-8B's plain step on "
    "one v5p chip: 21.19 GB for 16.19 GB of arguments), and a cross-program prefetch copies a "
    "whole embedding table for a lookup of a few rows. The roofline uses the HBM column: the "
    "cost programs compiled once more with both kinds of prefetch off, whose consumers then "
    "read their operands from HBM, nothing kept in VMEM between steps (the same step: 15.71 "
    "GB). That is XLA's model of HBM traffic, not a measurement: a fusion that a TPU re-reads "
    "in tiles is counted once.",
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
           f"abstract weights; {_head_text(st)}; SpecVocab ranker rank {st['ranker_rank']}"
           + ("" if result.get("paper") else
              f"; crossvocab drafter {st['cross_draft']} (id map of tiny tokenizers: only its "
              f"[Vd] shape reaches the program)"),
           (f"- tau: PUBLISHED, from the paper (each row's source under the table): "
            f"{result['paper']}; every speedup below is a PROJECTION of that tau onto this "
            f"TPU's compiled step costs, not a measurement" if result.get("paper") else
            f"- tau: {result['run'] or 'no --run given'}"), "",
           "| method | programs | weights + inputs GiB | KV GiB | temps GiB | total GiB "
           "(HBM) | fits | max cache slots | GFLOP | GB accessed (XLA, as compiled) | GB "
           "to and from HBM | HBM bytes / bytes to read | PROJECTED roofline "
           "time us | PROJECTED floor us (arguments read once) | bound | Pallas bytes (not "
           "counted) | tau | PROJECTED speedup | GB streamed (model) | PROJECTED weight-stream "
           "time us | PROJECTED speedup (weight-stream) |",
           "|" + "---|" * 21]
  for r in result["rows"]:
    g = lambda k: f"{r[k] / GiB:.3f}" if r.get(k) is not None else "-"  # noqa: E731
    if "error" in r:
      first = r["error"].splitlines()
      msg = " ".join(x.strip() for x in first[1:3]) or first[0]
      lines.append(f"| {_name(r)} | - | - | - | - | - | "
                   f"{'no' if r.get('fits') is False else 'error'} | - | - | - | - | - | - | "
                   f"- | - | - | {_tau(r)} | - | - | - | - |")
      lines.append(f"|  | error: {msg[:300]} |" + " |" * 19)
      continue
    if r.get("roofline_s") is None:  # does not fit (checked before compiling)
      lines.append(f"| {_name(r)} | - | {g('weights_bytes')} | {g('kv_bytes')} | - | "
                   f"{r['needed_bytes'] / GiB:.3f} ({r['hbm_bytes'] / GiB:.0f}) | no: "
                   f"{r['needed_bytes']:,} > {r['hbm_bytes']:,} bytes | - | - | - | - | - | "
                   f"- | - | - | - | {_tau(r)} | - | - | - | - |")
      continue
    slots = r["max_cache_slots"]
    pb = r.get("pallas_bytes_not_counted")
    lines.append(
        f"| {_name(r)} | {' + '.join(r['cost_programs'])} | {g('weights_bytes')} | "
        f"{g('kv_bytes')} | {g('temp_bytes')} | {g('total_bytes')} "
        f"({r['hbm_bytes'] / GiB:.0f}) | {'yes' if r['fits'] else 'NO'} | "
        f"{slots:,} | {r['flops'] / 1e9:.2f} | {r['bytes_accessed'] / 1e9:.3f} | "
        f"{r.get('hbm_bytes_accessed', r['bytes_accessed']) / 1e9:.3f} | "
        + (f"{r['bytes_ratio']:.2f} | " if r.get("bytes_ratio") is not None else "- | ")
        + f"PROJECTED {r['roofline_s'] * 1e6:.0f} | PROJECTED {r['args_floor_s'] * 1e6:.0f} | "
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
            "to and from HBM / HBM bandwidth) per chip, from the compiled programs' cost "
            "analysis (the HBM count: the programs compiled again with memory-space "
            "assignment's VMEM prefetches priced out, `vocabjax.bench.tpu.HBM_COST_OPTIONS`; "
            "XLA's count as compiled adds each prefetch's VMEM write and re-read); HBM bytes / "
            "bytes to read: that count over the modelled streamed bytes (less a Pallas "
            "kernel's, which XLA does not count); "
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


def _head_text(st: dict) -> str:
  if "dflash_drafter" in st:
    d = st["dflash_drafter"]
    return (f"DFlash drafter of {d['layers']} layers (intermediate {d['intermediate']}) "
            f"reading target layers {d['target_layer_ids']}, over the target's LM head")
  h = st["eagle_head"]
  return (f"EAGLE head ({h.get('kind', 'eagle3')}) Vd={h['draft_vocab']}, intermediate "
          f"{h['intermediate']}")
