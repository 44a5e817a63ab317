"""notebooks/quickstart.ipynb runs top to bottom on CPU with tiny models."""

import json
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.delenv("VOCABJAX_REPO", raising=False)
  nb = json.loads(NOTEBOOK.read_text())
  ns = {"__name__": "__main__"}
  ran = 0
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
      continue
    src = "".join(cell["source"])
    assert not any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()), \
        f"cell {i} uses IPython magics; keep the notebook plain Python"
    exec(compile(src, f"{NOTEBOOK.name}[cell {i}]", "exec"), ns)
    ran += 1
  assert ran >= 4
  assert ns["summary"]["methods"][1]["overall"]["tau"] == 4.0  # self-drafting, gamma 3
  assert (ns["OUT"] / "speedup_by_group.png").exists()
