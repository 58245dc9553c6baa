"""What a new user hits in the first hour, run as they would run it: real scripts, real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)

# The README's first example, saved as a script: `.run()` at module level, no __main__ guard;
# a helper, a class and a constant of the script are used by the steps (shipped by value).
UNGUARDED = textwrap.dedent(
    """
    from pipelines import Pipeline, grid

    OFFSET = 3

    class Scaler:
        def __init__(self, f):
            self.f = f

    def load(seed):
        return list(range(10 + seed))

    def helper(x, k):
        return sum(x) % (k + OFFSET) / 10

    def score(x, k):
        return {"acc": helper([Scaler(2).f * v for v in x], k)}

    p = Pipeline("unguarded")
    output = p.source(load, seed=0).explore("m", grid(score, k=[1, 2, 3])).choose("acc")
    r = output.run(workers=2, quiet=True, progress=False)
    print("RESULT", r.value["acc"], len(r.table))
    """
)


def _env():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_script_without_main_guard_runs_with_python(tmp_path):
    f = tmp_path / "explore.py"
    f.write_text(UNGUARDED)
    out = subprocess.run(
        [sys.executable, str(f)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env()
    )
    assert out.returncode == 0, out.stderr[-3000:]
    expected = max(sum(2 * v for v in range(10)) % (k + 3) / 10 for k in (1, 2, 3))
    assert out.stdout.split() == ["RESULT", str(expected), "3"]
    assert "bootstrapping phase" not in out.stderr


def test_script_without_main_guard_runs_with_quiver_run(tmp_path):
    f = tmp_path / "explore.py"
    f.write_text(UNGUARDED)
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", str(f), "--workers", "2", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT" in out.stdout  # the module-level run, while the file was loaded
    assert "chosen branch(es):" in out.stdout  # then the CLI's own run of `output`
    assert "bootstrapping phase" not in out.stderr
