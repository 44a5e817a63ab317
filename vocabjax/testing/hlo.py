"""Reading a compiled program's optimized HLO in tests: which arrays it materializes."""

from __future__ import annotations

import re

_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]\S* ([\w-]+)\(")
_FUSED = re.compile(r"calls=%([\w.-]+)")
# no new buffer: the operand itself, a view of it, or a loop's / call's pass-through
_VIEWS = {"parameter", "get-tuple-element", "bitcast", "opt-barrier"}


def _unfused(hlo_text: str):
  """(computation, is the entry, `_INSTR` match) of every instruction outside fused
  computations (those a fusion calls: computed element by element where they are read)."""
  fused = set(_FUSED.findall(hlo_text))
  comp, entry = None, False
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and "{" in line:  # a computation's header
      entry = line.startswith("ENTRY")
      comp = line.split()[1 if entry else 0].lstrip("%")
      continue
    m = _INSTR.match(line)
    if m and comp not in fused:
      yield comp, entry, m


def materialized(hlo_text: str, shape: tuple[int, ...],
                 dtype: str | None = None) -> list[tuple[str, str, str]]:
  """(computation, instruction, opcode) of every instruction outside fusions whose result has
  `shape` (of HLO element type `dtype`, e.g. "f32"; any when None) and is a new buffer: e.g. an
  embedding table widened to f32 in a loop. Instructions inside a fused computation are
  computed element by element where they are read (a fused gather converts only the rows it
  reads), so they are not counted.

  Name the dtype where a tiny model's table shape can coincide with another array: XLA:GPU
  merges a tiny layer's q / k / v projections into one dot over their concatenated weights,
  written every step, and a test model with 32 + 16 + 16 output rows over D = 32 gives a
  bf16[64, 32] that a V = 64, D = 32 table's check would take for the table (a recorded H200 run's
  H200 run)."""
  want = ",".join(map(str, shape))
  return [(comp, m.group(1), m.group(4)) for comp, _, m in _unfused(hlo_text)
          if m.group(3) == want and m.group(4) not in _VIEWS and dtype in (None, m.group(2))]


def step_hlo(decoder) -> list[str]:
  """The optimized HLO of the compiled programs a decoder built so far (its `ProgramCache`),
  prefills left out (a prompt block's activations may share a table's shape; the loops are in
  the steps)."""
  texts = [p.as_text() for progs in decoder.compiled_programs().values()
           for p in (progs if isinstance(progs, tuple) else (progs,)) if hasattr(p, "as_text")]
  return [t for t in texts if "prefill" not in t.split(",")[0]]


def whole_array_writes(hlo_text: str, shape: tuple[int, ...],
                       entry_only: bool = True) -> list[tuple[str, str]]:
  """(instruction, kind) of the entry computation's instructions that write a buffer of
  `shape` or a permutation of it (a transposed copy): kind "copy", "transpose" (a transpose, or
  a fusion XLA named after one), "in-place" (a dynamic-update-slice fusion: it writes its
  update into its operand's buffer, unless that is a copy) or "other". For a decoding step and
  its stacked KV cache: what it rewrites beside the slots it writes. `entry_only=False`: every
  computation that is not a fusion's (loop bodies too: a drafting loop's writes happen per
  iteration), instructions named "<computation>/<instruction>"."""
  want = sorted(shape)
  out = []
  for comp, entry, m in _unfused(hlo_text):
    name, op, dims = m.group(1), m.group(4), m.group(3)
    if ((entry or not entry_only) and op in ("fusion", "copy", "transpose") and dims
        and sorted(map(int, dims.split(","))) == want):
      kind = ("copy" if op == "copy" else
              "in-place" if "dynamic_update_slice" in name.replace("-", "_") else
              "transpose" if op == "transpose" or "transpose" in name else "other")
      out.append((name if entry_only else f"{comp}/{name}", kind))
  return out
