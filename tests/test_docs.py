"""The documentation site: the API reference lists exactly each package's ``__all__``, and the
site builds with Sphinx with warnings as errors (``make docs``), the example gallery included:
its pages show what the examples printed and drew when this build ran them."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ["pipelines", "pipelines.sklearn", "graph", "gpu"]


def documented() -> dict[str, list[str]]:
    """Names listed under each ``.. currentmodule::`` in docs/api.rst's autosummary tables."""
    names: dict[str, list[str]] = {}
    module = None
    in_table = False
    for line in (DOCS / "api.rst").read_text().splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            module, in_table = m.group(1), False
        elif line.startswith(".. autosummary::"):
            in_table = True
        elif in_table and re.match(r"   [A-Za-z_]\w*$", line):
            names.setdefault(module, []).append(line.strip())
        elif in_table and line and not line.startswith(" "):
            in_table = False
    return names


def test_api_reference_lists_every_public_name():
    docs = documented()
    assert set(docs) == set(PACKAGES), f"docs/api.rst documents {sorted(docs)}; expected {PACKAGES}"
    # a re-export documented under another package (graph.RunError is pipelines.RunError) counts;
    # only names missing from their own list are resolved, so gpu's lazy names (torch) stay unloaded
    documented_objects = {id(getattr(importlib.import_module(pkg), n)) for pkg in ("pipelines",) for n in docs[pkg]}
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        public = set(mod.__all__)
        listed = set(docs[pkg])
        extra = listed - public
        assert not extra, f"docs/api.rst lists {sorted(extra)} under {pkg}, which {pkg}.__all__ does not export"
        missing = sorted(n for n in public - listed if id(getattr(mod, n)) not in documented_objects)
        assert not missing, f"{pkg}.__all__ has {missing}, missing from docs/api.rst: add them to its autosummary"
        assert len(docs[pkg]) == len(listed), f"docs/api.rst lists a name twice under {pkg}"


def _missing_doc_tools() -> list[str]:
    return [m for m in ("sphinx", "myst_parser", "pydata_sphinx_theme", "sphinx_gallery", "matplotlib", "sklearn")
            if importlib.util.find_spec(m) is None]


# the build runs the gallery's examples (docs/gallery_hooks.py): about 2 minutes on 2 quiet cores
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_docs_build_without_warnings(tmp_path):
    missing = _missing_doc_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]' (make setup does)")
    out = tmp_path / "html"
    t0 = time.perf_counter()
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
         str(DOCS), str(out)],
        capture_output=True, text=True, timeout=570, cwd=ROOT,
        env={**os.environ, "QUIVER_GALLERY_RERUN": "1"},  # run every example now, not an earlier build's pages
    )
    seconds = time.perf_counter() - t0
    assert build.returncode == 0, f"sphinx-build -W failed:\n{build.stderr[-4000:]}"
    print(f"docs built in {seconds:.1f} s")
    # every guide page, the contract and every documented name became a page
    for page in ["index", "architecture", "api", "changelog", "known-gaps", "guide/benchmarks", "guide/troubleshooting"]:
        assert (out / f"{page}.html").exists(), page
    for pkg, names in documented().items():
        for name in names:
            html = out / "generated" / f"{pkg}.{name}.html"
            assert html.exists(), f"no API page for {pkg}.{name}"
    result_page = (out / "generated" / "pipelines.Result.html").read_text()
    assert "compute_value" in result_page  # autodoc read the docstrings, not just the names
    assert "Common cases: Quiver vs the tool you already have" in (out / "guide" / "benchmarks.html").read_text()
    check_gallery(out)


def check_gallery(out: Path) -> None:
    """The gallery pages show what this build's runs printed and drew; the unexecuted one says why."""
    gallery = out / "gallery"
    index = (gallery / "index.html").read_text()
    for example in ("digits_explore", "sklearn_search", "tune_mnist", "big_table_explore", "mnist_sma"):
        assert f"{example}.html" in index, f"the gallery index does not link {example}"
    digits = (gallery / "digits_explore.html").read_text()
    # its real output: the chosen branch and the task counts it printed (tests/digits_expect.py's numbers)
    assert re.search(r"chosen: scaler=\w+ pca=\d+ model=fit_\w+ validation accuracy=0\.9\d+", digits), digits[-3000:]
    assert "63 branches: 77 tasks executed, 139 unique, 315 naive" in digits
    images = re.findall(r'<img [^>]*src="\.\./(_images/sphx_glr_digits_explore_\d+\.png)"', digits)
    assert images, "no figure on the digits page"
    for src in images:
        png = (out / src).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000, f"{src} is not a drawn figure"
    tune = (gallery / "tune_mnist.html").read_text()
    assert "pruned" in tune and "chosen: lr=" in tune and "sphx_glr_tune_mnist_" in tune
    assert "peak memory" in (gallery / "big_table_explore.html").read_text()
    sma = (gallery / "mnist_sma.html").read_text()
    assert "sphx-glr-script-out" not in sma and "takes minutes on 2 CPU cores" in sma
