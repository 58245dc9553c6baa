"""The README is a first contact: short, its links resolve, and its first example runs as pasted.

The example is read from README.md itself (the first ```python block under "## A first
example"), saved as ``first.py`` and run with ``python first.py`` in a subprocess, on the
embedded cluster it starts; what it prints must match the output pasted under it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Pages other changes add beside this one; linked from the README, checked once they exist.
PENDING = {"docs/sklearn-dropin.md", "docs/gpu-check.md"}


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _fences(section: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block of ``section``, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, flags=re.S | re.M)


def first_example() -> tuple[str, str]:
    """The README's first example and the output pasted under it."""
    blocks = _fences(_section(README.read_text(), "## A first example"))
    code = next(body for lang, body in blocks if lang == "python")
    output = next(body for lang, body in blocks if lang == "")
    return code, output


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines; keep it a first contact (<= 200) and move detail to docs/guide/"


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert "docs/guide/training.md" in local  # the capability lines are there
    missing = [link for link in local if not (ROOT / link).exists() and link not in PENDING]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_first_example_extracted_from_readme():
    code, output = first_example()
    assert "from pipelines import Pipeline, grid" in code and ".run(" in code
    assert "chosen:" in output


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_first_example_runs_as_pasted(tmp_path):
    code, pasted = first_example()
    script = tmp_path / "first.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "first.py"], cwd=tmp_path, capture_output=True, text=True, timeout=220, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout.splitlines()
    expected = pasted.splitlines()
    # the chosen branch and the task counts, exactly as pasted in the README
    for prefix in ("chosen:", "{'naive_tasks'"):
        want = next(line for line in expected if line.startswith(prefix))
        assert want in printed, f"README shows {want!r}; the example printed:\n{out.stdout}"
    # the table: the same branches, the chosen one marked
    chosen_rows = [line.split() for line in printed if line.rstrip().endswith("True")]
    assert chosen_rows == [["7", "minmax", "svc", "10.00", "0.994444", "ok", "True"]], out.stdout
    assert sum(line.rstrip().endswith(("True", "False")) for line in printed) == 8
    assert "dashboard: http://127.0.0.1:" in out.stderr  # the embedded cluster's link, as pasted
