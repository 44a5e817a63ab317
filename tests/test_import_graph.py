"""The package's import graph is one-way: no cycles, and no vocabjax module imported inside a
function (which is how cycles hide) unless the line states why (`# local: <reason>`).

Layers, bottom up: errors, io, prompts -> sampling, kernels, models -> checkpoints -> vocab ->
decoding -> (calibrate, train) -> eval -> entry points (generate, bench, the __main__ modules)."""

import ast
import sys
from pathlib import Path

import vocabjax

ROOT = Path(vocabjax.__file__).resolve().parent
# a module may import only from its own layer or those below (layer of its first name part)
LAYER = {"errors": 0, "io": 0, "prompts": 0, "version": 0, "interrupt": 0, "lowering": 0,
         "backends": 0, "plots": 0, "jax_internals": 0, "sampling": 1,
         "sharding": 1, "distributed": 1, "kernels": 1, "models": 1,
         "checkpoints": 2, "vocab": 3, "decoding": 4, "calibrate": 5, "train": 5,
         "eval": 6, "methods": 6, "zoo": 7, "generate": 7, "testing": 7, "bench": 7,
         "__init__": 8}


def _modules() -> dict[str, Path]:
  out = {}
  for f in ROOT.rglob("*.py"):
    parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = f
  return out


def _edges():
  """{module: {(imported module, line number, is function-local, line text)}}."""
  mods = _modules()

  def resolve(name):
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name or None

  edges = {}
  for m, f in mods.items():
    src = f.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    local = {id(n) for fn in ast.walk(tree)
             if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(fn)}
    out = edges.setdefault(m, set())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        base = node.module or ""
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
      else:
        continue
      for t in targets:
        r = resolve(t) if t.startswith("vocabjax") else None
        if r and r != m:
          out.add((r, node.lineno, id(node) in local, lines[node.end_lineno - 1]))
  return edges


def _layer(module: str) -> int:
  parts = module.split(".")
  if len(parts) == 1 or parts[-1] == "__main__":
    return LAYER["__init__"]
  return LAYER.get(".".join(parts[1:3]), LAYER[parts[1]])


def test_no_import_cycles():
  graph = {m: {t for t, *_ in es} for m, es in _edges().items()}
  # a package's __init__ may import its own submodules (that is what re-exporting is)
  graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
  state, stack, cycles = {}, [], []

  def visit(v):
    state[v] = 1
    stack.append(v)
    for w in sorted(graph[v]):
      if state.get(w) == 1:
        cycles.append(stack[stack.index(w):] + [w])
      elif w not in state:
        visit(w)
    stack.pop()
    state[v] = 2

  for v in sorted(graph):
    if v not in state:
      visit(v)
  assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_unexplained_function_local_imports_of_vocabjax():
  bad = [f"{m}:{line} {text.strip()}" for m, es in _edges().items()
         for _, line, local, text in es if local and "# local:" not in text]
  assert not bad, "function-local vocabjax imports without a stated reason:\n" + "\n".join(bad)


def test_layers_import_downwards_only():
  bad = []
  for m, es in _edges().items():
    for t, line, _, text in es:
      if _layer(t) > _layer(m) and not t.startswith(m + "."):
        bad.append(f"{m}:{line} imports {t} (a higher layer): {text.strip()}")
  assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_claim(tmp_path, monkeypatch):
  # the walker sees a function-local import and a cycle when they are there
  pkg = tmp_path / "vocabjax"
  (pkg / "models").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "models" / "__init__.py").write_text("")
  (pkg / "models" / "a.py").write_text("from vocabjax.models.b import f\n")
  (pkg / "models" / "b.py").write_text("def f():\n  from vocabjax.models.a import g\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
  edges = _edges()
  assert ("vocabjax.models.b", 1, False,
          "from vocabjax.models.b import f") in edges["vocabjax.models.a"]
  assert any(t == "vocabjax.models.a" and local for t, _, local, _ in edges["vocabjax.models.b"])
  try:
    test_no_import_cycles()
  except AssertionError as e:
    assert "vocabjax.models.a -> vocabjax.models.b -> vocabjax.models.a" in str(e)
  else:
    raise AssertionError("the cycle a -> b -> a was not reported")
