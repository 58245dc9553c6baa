"""The package layout rules: import direction pipelines -> graph -> gpu, no Dask at builder import."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["pipelines", "graph", "gpu"]
ALLOWED = {"pipelines": {"graph", "gpu"}, "graph": {"gpu"}, "gpu": set()}


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages a module imports, lazily (inside functions) or not."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package):
    for path in (ROOT / package).rglob("*.py"):
        wrong = imported_packages(path) - ALLOWED[package] - {package}
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}: imports must run pipelines -> graph -> gpu"


@pytest.mark.parametrize("package", PACKAGES)
def test_public_api_is_listed(package):
    module = importlib.import_module(package)
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_builder_import_does_not_import_dask():
    code = "import sys, pipelines, graph; print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
