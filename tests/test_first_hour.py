"""What a new user hits in the first hour, run as they would run it: real scripts, real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: scripts run with python, embedded clusters

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
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


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


MIXED = textwrap.dedent(
    """
    import math
    from pipelines import Pipeline, grid

    def load():
        return 1.0

    def tree(x, max_depth):
        return {"score": float("nan") if max_depth == 1 else (max_depth or 10) / 10}

    def linear(x, c):
        return {"score": c / 100}

    output = Pipeline("mixed").source(load).explore(
        "model", grid(tree, max_depth=[None, 1, 3]), grid(linear, c=[5, 50])
    ).choose("score", k=2)
    """
)


def _strict_loads(text):
    import json

    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _quiver(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", *args, "--workers", "2", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env(),
    )


def test_json_is_strict_with_branch_ids_and_none_apart_from_not_applicable(tmp_path):
    f = tmp_path / "mixed.py"
    f.write_text(MIXED)
    out = _quiver(tmp_path, str(f), "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    data = _strict_loads((tmp_path / "r.json").read_text())
    rows = {r["branch"]: r for r in data["table"]}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[0]["model.max_depth"] is None and "model.c" not in rows[0]  # None, and not applicable
    assert rows[1]["score"] is None  # NaN metric -> null
    assert rows[3]["model.c"] == 5 and "model.max_depth" not in rows[3]
    assert [r["branch"] for r in data["table"] if r["chosen"]] == [0, 4]  # 1.0 and 0.5
    # the printed table is sorted by the choose's metric, best first, NaN last
    lines = [ln for ln in out.stdout.splitlines() if ln[:1].isdigit() and "branches;" not in ln]
    assert [int(ln.split()[0]) for ln in lines] == [0, 4, 2, 3, 1]
    assert "sorted by score, highest first" in out.stdout


def test_failed_run_still_writes_json_and_report_with_every_branch_error(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text(MIXED.replace('return {"score": c / 100}', 'raise ValueError(f"bad c={c}")').replace(
        'float("nan") if max_depth == 1 else (max_depth or 10) / 10', "1 / 0"))
    out = _quiver(tmp_path, str(f), "--json", str(tmp_path / "r.json"), "--report", str(tmp_path / "rep"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("quiver: error: every branch failed")
    data = _strict_loads((tmp_path / "r.json").read_text())
    assert data["ok"] is False and data["error"].startswith("every branch failed")
    errors = {r["branch"]: r["error"] for r in data["table"]}
    assert len(errors) == 5 and all(r["status"] == "failed" for r in data["table"])
    assert errors[3] == "ValueError: bad c=5" and errors[4] == "ValueError: bad c=50"
    assert errors[0].startswith("ZeroDivisionError")
    assert "Traceback" in data["table"][3]["traceback"]
    # the user's file and line, not cloudpickle's "<dynamic-code>"
    assert f'File "{f}", line ' in data["table"][3]["traceback"] and "<dynamic-code>" not in data["table"][3]["traceback"]
    assert 'raise ValueError(f"bad c={c}")' in data["table"][3]["traceback"]
    # the workers' log: one line per kind of error (and worker), not a block per failed task
    assert "Key:       " not in out.stderr and "Traceback: " not in out.stderr
    assert 3 <= out.stderr.count("Compute Failed: step") <= 6
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "The run failed" in html and "bad c=50" in html


def test_tight_memory_budget_ends_with_a_clear_error_instead_of_pausing_forever(tmp_path):
    # the exploration (a DataFrame, 3 cleanings x feature selection x 2 model families,
    # choose(k=3), a test step) with the budget that made its workers pause forever: the
    # workers' idle memory, measured with scikit-learn and pandas loaded, leaves no room
    f = tmp_path / "frames.py"
    f.write_text("from tests.frame_steps import digits_exploration\noutput = digits_exploration(copies=1)\n")
    out = _quiver(tmp_path, str(f), "--memory-budget", "500MiB", "--stall-timeout", "30")
    assert out.returncode == 1, out.stdout[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    # each worker's 250 MiB is less than pandas and scikit-learn take once imported, so the run
    # stops before any step runs and says so. Which of two clear errors comes first is a race
    # with the nanny's memory monitor: it kills the worker during the import (the libraries are
    # named), or the import completes and the idle worker is measured above its share first
    died = "quiver: error: a worker died while loading the libraries the steps use ("
    no_room = "quiver: error: memory budget 500.00 MiB over 2 worker(s) leaves no room for results: "
    assert last.startswith((died, no_room)), last
    if last.startswith(died):
        assert "pandas" in last and "sklearn" in last
    else:
        assert "each worker gets 250.00 MiB" in last and "an idle worker already uses about" in last
    assert "raise memory_budget or use fewer workers" in last.lower()


GUARDED_POOL = textwrap.dedent(
    """
    import multiprocessing as mp
    from pipelines import Pipeline, grid

    def square(x):
        return x * x

    def score(x, k):
        return {"acc": k / 10}

    if __name__ == "__main__":
        p = Pipeline("guarded")
        r = p.source(lambda: 1).explore("m", grid(score, k=[1, 2])).choose("acc").run(workers=1, quiet=True, progress=False)
        # the script's own spawned process, while the kept cluster lives: it re-runs __main__ (guarded) to find square
        with mp.get_context("spawn").Pool(1) as pool:
            print("POOL", pool.map(square, [3])[0])
        print("RESULT", r.value["acc"])
    """
)


def test_a_guarded_scripts_own_spawned_processes_are_left_as_python_makes_them(tmp_path):
    """Issue 50: only an unguarded script gets the workers' skip of ``__main__`` (process-wide);
    a guarded one's own ``spawn`` children re-run ``__main__`` as Python does, and find its functions."""
    f = tmp_path / "guarded.py"
    f.write_text(GUARDED_POOL)
    out = subprocess.run([sys.executable, str(f)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["POOL", "9", "RESULT", "0.2"]


UNGUARDED_LIBRARY = textwrap.dedent(
    """
    from sklearn.preprocessing import StandardScaler

    from pipelines import Pipeline, grid

    def load(seed):
        return [[float(v)] for v in range(10 + seed)]

    def score(x, k):
        return {"acc": float(StandardScaler().fit_transform(x).sum() + k) / 10}

    output = Pipeline("unguarded").source(load, seed=0).explore("m", grid(score, k=[1, 2, 3])).choose("acc")
    r = output.run(workers=2, quiet=True, progress=False)
    print("RESULT", r.value["acc"], len(r.table))
    """
)


def test_an_unguarded_script_importing_a_library_starts_no_worker_that_reruns_it(tmp_path):
    """The README's shape: a library imported at the top, the run at module level. Its workers
    start on the bridge's thread; the script's guard must be read on the caller's (the README's
    example printed six tracebacks and took a minute, the forked workers re-running it, before)."""
    f = tmp_path / "explore.py"
    f.write_text(UNGUARDED_LIBRARY)
    out = subprocess.run([sys.executable, str(f)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    assert words[0] == "RESULT" and abs(float(words[1]) - 0.3) < 1e-9 and words[2] == "3"
    assert "Traceback" not in out.stderr and "Nanny failed" not in out.stderr, out.stderr[-3000:]
