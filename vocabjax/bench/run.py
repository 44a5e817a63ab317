"""The benchmark's run: every (model, program, dtype, batch, tokens, head) row of a grid timed
once, appended to `rows.jsonl` as it finishes, so an interrupted run (or one cut by a lent
machine's per-command limit) resumes where it stopped; `bench.md` and `bench.json` are
rewritten from all rows at the end.

    out/meta.json    the device and the settings that change timings (a rerun on another
                     device or with other settings refuses, or with overwrite moves the old
                     directory aside)
    out/rows.jsonl   one line per timed program (`ROW_FIELDS`)
    out/bench.json   meta + rows;  out/bench.md  the tables
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax

from vocabjax.bench import engine, shapes
from vocabjax.bench.engine import BenchError, Head
from vocabjax.eval.provenance import cpu_model
from vocabjax.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl

ROW_FIELDS = ("model", "role", "program", "dtype", "B", "T", "head", "s", "bytes", "GBps",
              "compile_s", "read_GBps")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a run measures. `tokens`: T of the target programs; `draft_tokens`: T of the
  drafter's body; `head_rows`: hidden rows per batch row of the drafter's head programs."""

  pairs: tuple[tuple[str, str], ...]
  dtypes: tuple[str, ...]
  batches: tuple[int, ...]
  # T = gamma + 1 (chain) and nodes + 1 (trees of 4, 8, 16) measured, not interpolated
  tokens: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 64)
  draft_tokens: tuple[int, ...] = (1, 2, 4, 5, 8)
  heads: tuple[str, ...] = ("full", "trim:65536", "trim:32768", "trim:16384", "trim:8192",
                            "specvocab:512", "specvocab:1024", "specvocab:2048")
  head_rows: tuple[int, ...] = (1, 2, 4)
  ranker_rank: int = 56
  context: int = 512
  repeats: int = 5
  max_rows: int = 4096  # B * T above this is skipped (memory, minutes)
  bandwidth_bytes: int = 1 << 30

  def check(self) -> None:
    for name in ("dtypes", "batches", "tokens", "draft_tokens", "heads", "head_rows", "pairs"):
      if not getattr(self, name):
        raise BenchError(f"{name} is empty: nothing to measure")
    for name in ("batches", "tokens", "draft_tokens", "head_rows"):
      bad = [v for v in getattr(self, name) if v < 1]
      if bad:
        raise BenchError(f"{name} must be positive, got {bad}")
    for d in self.dtypes:
      if d not in ("float32", "bfloat16", "int8"):
        raise BenchError(f"dtype {d!r}: choose float32, bfloat16 or int8")
    if self.context < 1 or self.repeats < 1:
      raise BenchError(f"context={self.context} and repeats={self.repeats} must be positive")
    for h in self.heads:
      Head.parse(h, self.ranker_rank)

  def timing_key(self) -> dict:
    """The settings a row's time depends on beyond its own key (a resume must match them)."""
    return {"context": self.context, "repeats": self.repeats, "ranker_rank": self.ranker_rank,
            "max_len_target": self.context + max(self.tokens),
            "max_len_draft": self.context + max(self.draft_tokens)}


def device_info() -> dict:
  d = jax.devices()[0]
  return {"backend": jax.default_backend(), "device": d.device_kind, "devices": jax.device_count(),
          "host_cpu": cpu_model(), "cpus": os.cpu_count(), "jax": jax.__version__,
          "platform": platform.platform()}


def default_out(info: dict) -> Path:
  """runs/bench/<device> (git-ignored, like the eval's runs/): the GPU's kind, or
  cpu-<model and vector ISA>; recorded results go to kernels/results/bench/<device> by --out."""
  name = info["device"] if info["backend"] != "cpu" else f"cpu {info['host_cpu']}"
  return Path("runs/bench") / re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def _key(r: dict) -> tuple:
  return (r["model"], r["role"], r["program"], r["dtype"], r["B"], r["T"], r["head"])


def plan(settings: Settings) -> list[dict]:
  """Every row of the grid (without times), a model's rows together, in the order they run."""
  rows, seen = [], set()
  for target, draft in settings.pairs:
    for role, model in (("target", target), ("draft", draft)):
      for dtype in settings.dtypes:
        for B in settings.batches:
          if role == "target":
            items = [("target", T, "") for T in settings.tokens]
          else:
            items = ([("drafter_body", T, "") for T in settings.draft_tokens]
                     + [("drafter_head", r, h) for r in settings.head_rows for h in settings.heads])
          for program, T, head in items:
            if B * T > settings.max_rows:
              continue
            if head.startswith("specvocab") and dtype == "int8":
              continue  # a ranker is matched to a float head (`SpeculativeVocab.attach`)
            row = {"model": model, "role": role, "program": program, "dtype": dtype, "B": B,
                   "T": T, "head": head}
            if _key(row) not in seen:
              seen.add(_key(row))
              rows.append(row)
  return rows


def _prepare(out: Path, meta: dict, overwrite: bool) -> tuple[list[dict], dict]:
  """(the rows already timed in `out` under the same device and settings, their meta)."""
  meta_path = out / "meta.json"
  rows_path = out / "rows.jsonl"
  old = {}
  if meta_path.exists() or (rows_path.exists() and rows_path.stat().st_size):
    try:
      old = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
      old = None  # rows whose device and settings cannot be checked
    same = old is not None and all(old.get(k) == meta[k] for k in ("device", "timing"))
    if not same:
      if not overwrite:
        if old is None:
          raise BenchError(f"{out} holds {rows_path.name} without a readable meta.json: the "
                           f"device and settings its rows were timed under cannot be checked; "
                           f"use another --out or --overwrite to move them aside")
        raise BenchError(f"{out} holds rows of another device or other settings "
                         f"({old.get('device')}, {old.get('timing')}); use another --out or "
                         f"--overwrite to move them aside")
      aside = out.with_name(f"{out.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
      shutil.move(str(out), str(aside))
      print(f"[vocabjax.bench] moved the old rows to {aside}", file=sys.stderr)
      old = {}
    else:  # rows of earlier runs' models stay in the reports
      meta["models"] = {**old.get("models", {}), **meta["models"]}
  out.mkdir(parents=True, exist_ok=True)  # meta.json is written by run_bench, probe included
  return read_jsonl(out / "rows.jsonl", BenchError), old


def run_bench(settings: Settings, out: str | os.PathLike | None = None, *, command: str = "",
              overwrite: bool = False, progress: bool = True) -> dict:
  """Time every row of `plan(settings)` not yet in `out`; write the reports; return
  {"meta", "rows"}."""
  from tqdm.auto import tqdm

  settings.check()
  configs = {}
  for pair in settings.pairs:
    for model in pair:
      configs[model] = shapes.resolve_config(model)[1]
  for _, draft in settings.pairs:
    for h in settings.heads:
      Head.parse(h, settings.ranker_rank).check(configs[draft].vocab_size, draft)
  info = device_info()
  out = Path(out) if out else default_out(info)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  meta = {"device": info, "timing": settings.timing_key(), "settings": dataclasses.asdict(settings),
          "models": {m: dataclasses.asdict(c) for m, c in configs.items()},
          "command": command, "commit": commit,
          "date": datetime.datetime.now().isoformat(timespec="seconds")}
  rows_done, old = _prepare(out, meta, overwrite)
  done = {_key(r): r for r in rows_done}
  todo = [r for r in plan(settings) if _key(r) not in done]
  print(f"[vocabjax.bench] {info['backend']} ({info['device']}): {len(todo)} programs to time, "
        f"{len(done)} already in {out}", file=sys.stderr)
  if todo or "read_GBps" not in old:  # measured beside the programs it is compared with
    meta["read_GBps"] = engine.read_bandwidth(settings.bandwidth_bytes, settings.repeats)
    print(f"[vocabjax.bench] read bandwidth {meta['read_GBps']:.1f} GB/s", file=sys.stderr)
  else:
    meta["read_GBps"] = old["read_GBps"]
  atomic_write_json(out / "meta.json", meta)
  bar = tqdm(total=len(todo), desc="bench", disable=not progress, file=sys.stderr)
  groups: dict[tuple, list[dict]] = {}
  for r in todo:
    groups.setdefault((r["model"], r["role"], r["dtype"]), []).append(r)
  for (model, role, dtype), rows in groups.items():
    cfg = configs[model]
    params = engine.random_params(cfg, dtype)
    T_max = max(settings.tokens if role == "target" else settings.draft_tokens)
    progs = engine.Programs(cfg, params, context=settings.context,
                            max_len=settings.context + T_max)
    weights = engine.layer_weight_bytes(params)
    kv_isz = progs.dtype.itemsize
    for r in rows:
      B, T = r["B"], r["T"]
      t0 = time.perf_counter()
      if r["program"] == "target":
        call = progs.target(B, T)
        nbytes = (weights + engine.head_bytes(params, cfg, Head("full"), B, T)
                  + engine.kv_bytes(cfg, B, settings.context + T, kv_isz))
      elif r["program"] == "drafter_body":
        call = progs.body(B, T)
        nbytes = weights + engine.kv_bytes(cfg, B, settings.context + T, kv_isz)
      else:
        head = Head.parse(r["head"], settings.ranker_rank)
        call = progs.head(head, B, T)
        nbytes = engine.head_bytes(params, cfg, head, B, T)
      compile_s = time.perf_counter() - t0
      s = engine.median_s(call, repeats=settings.repeats)
      del call
      row = {**r, "s": s, "bytes": nbytes, "GBps": nbytes / s / 1e9, "compile_s": compile_s,
             "read_GBps": meta["read_GBps"]}  # the probe of the run that timed this row
      append_jsonl(out / "rows.jsonl", row)
      done[_key(row)] = row
      bar.set_postfix_str(f"{model} {r['program']} {dtype} B={B} T={T} {r['head']} "
                          f"{1e3 * s:.1f} ms")
      bar.update(1)
    del progs, params
    gc.collect()
    write_reports(out, meta, done, settings)  # after each model: a run cut short keeps them
  bar.close()
  return write_reports(out, meta, done, settings)


def write_reports(out: Path, meta: dict, done: dict, settings: Settings) -> dict:
  """bench.json and bench.md in `out` (atomic) from the rows timed so far, in plan order."""
  order = {_key(r): i for i, r in enumerate(plan(settings))}
  rows = sorted(done.values(), key=lambda r: order.get(_key(r), len(order)))
  result = {"meta": meta, "rows": rows}
  atomic_write_json(out / "bench.json", result)
  atomic_write_text(out / "bench.md", render(result))
  return result


def render(result: dict) -> str:
  """bench.md: the target's programs (x its T=1 step), then the drafter's body and heads."""
  meta, rows = result["meta"], result["rows"]
  bw = meta.get("read_GBps") or float("nan")
  dev = meta["device"]
  t = meta["timing"]
  where = dev["host_cpu"] if dev["backend"] == "cpu" else dev["device"]
  lines = [f"# Engine programs on {where} ({dev['backend']}), {meta['date']}", "",
           f"`{meta['command']}`  ", f"commit {meta['commit']}, jax {dev['jax']}, host "
           f"{dev['host_cpu']} ({dev['cpus']} cpus); random weights of the real shapes; "
           f"{t['context']} cached tokens; median of {t['repeats']} calls after a warm-up. "
           f"Read bandwidth (a jitted sum over "
           f"{meta['settings']['bandwidth_bytes'] / 2**30:.2g} GiB) in the last run: {bw:.1f} "
           f"GB/s; `% bw` = the bytes a program must read (weights, KV cache, head rows) / its "
           f"time, against the probe of the run that timed it (rows resumed across runs).", "", "## Target: forward over T tokens + full LM head "
           "(T=1: a decoding step; T=gamma+1: a chain's verification; T=nodes+1: a tree's)", "",
           "| model | dtype | B | T | ms | x T=1 | GB/s | % bw |",
           "|---|---|---|---|---|---|---|---|"]
  base = {(r["model"], r["dtype"], r["B"]): r["s"] for r in rows
          if r["program"] == "target" and r["T"] == 1}
  for r in rows:
    if r["program"] != "target":
      continue
    b = base.get((r["model"], r["dtype"], r["B"]))
    x = f"{r['s'] / b:.2f}" if b else "-"
    lines.append(f"| {r['model']} | {r['dtype']} | {r['B']} | {r['T']} | {1e3 * r['s']:.2f} | "
                 f"{x} | {r['GBps']:.1f} | {100 * r['GBps'] / r.get('read_GBps', bw):.0f} |")
  lines += ["", "## Drafter: forward over T tokens (body), LM head over `rows` hidden rows per "
            "batch row", "", "| model | dtype | B | program | T / rows | head | ms | x full head "
            "| GB/s | % bw |", "|---|---|---|---|---|---|---|---|---|---|"]
  full = {(r["model"], r["dtype"], r["B"], r["T"]): r["s"] for r in rows
          if r["program"] == "drafter_head" and r["head"] == "full"}
  for r in rows:
    if r["role"] != "draft":
      continue
    f = full.get((r["model"], r["dtype"], r["B"], r["T"])) if r["head"] else None
    x = f"{r['s'] / f:.2f}" if f else "-"
    lines.append(f"| {r['model']} | {r['dtype']} | {r['B']} | {r['program'][8:]} | {r['T']} | "
                 f"{r['head'] or '-'} | {1e3 * r['s']:.2f} | {x} | {r['GBps']:.1f} | "
                 f"{100 * r['GBps'] / r.get('read_GBps', bw):.0f} |")
  return "\n".join(lines) + "\n"
