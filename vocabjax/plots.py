"""PNG figures without pyplot: reports, calibration and training curves draw on a bare
`matplotlib.figure.Figure`, so plotting never switches the process's matplotlib backend (a
notebook that imports vocabjax keeps its inline plots) and never leaves figures open in pyplot's
registry; each PNG is written atomically (`io.atomic_write_bytes`).

    fig, (a, b) = subplots(1, 2, figsize=(10, 4))
    a.plot(x, y)
    save_png(fig, out / "curves.png")
"""

from __future__ import annotations

import io as _io
import os

from vocabjax.io import atomic_write_bytes


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=(6, 4), squeeze: bool = True):
  """(figure, axes) as `pyplot.subplots` gives them, on a Figure pyplot does not manage."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=figsize)
  return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def save_png(fig, path: str | os.PathLike, dpi: int = 110) -> None:
  """Lay out `fig` and write it atomically as a PNG (Agg renders it; no backend is set)."""
  fig.tight_layout()
  buf = _io.BytesIO()
  fig.savefig(buf, format="png", dpi=dpi)
  atomic_write_bytes(path, buf.getvalue())
