"""examples/explore_in_jupyter.ipynb runs top to bottom in a real Jupyter kernel (nbclient) on a
real LocalCluster: the Result shows as HTML and the run shows a progress display, not text."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "explore_in_jupyter.ipynb"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _outputs(cell) -> list[dict]:
    return [dict(o) for o in cell.get("outputs", [])]


def test_notebook_runs_and_shows_the_result_as_html(tmp_path):
    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]' (make setup does)")
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")  # the kernel imports this checkout
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    run_cell = next(c for c in nb.cells if c.cell_type == "code" and "best.run(client)" in c.source)
    outs = _outputs(run_cell)
    html = [o["data"]["text/html"] for o in outs if o.get("output_type") == "execute_result" and "text/html" in o.get("data", {})]
    assert html, f"the Result did not display as HTML: {outs}"
    assert "Quiver result</b>: 8 branches" in html[0]
    assert "scaler=minmax &rarr; model=svc(C=10.0)" in html[0]  # the chosen path
    assert "/quiver-exploration" in html[0]  # the live cluster's dashboard
    progress = [o["data"]["text/plain"] for o in outs if o.get("output_type") == "display_data"]
    assert progress and progress[-1].startswith("[quiver] [") and "branches 8/8" in progress[-1], outs
    assert not any("\r[quiver]" in o.get("text", "") for o in outs)  # no terminal redraws in the notebook
