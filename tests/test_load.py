"""Load: a 2,000-branch exploration of cheap steps on 2 workers, and the load benchmark's smoke mode.

No timing assertions: the structural facts that keep compile and execution linear are checked
instead (one key computation per step instance, unique tasks only, every unique task run once).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import graph
import graph.compiling.compiler
from pipelines import Pipeline, grid
from tests import steps

ROOT = Path(__file__).resolve().parents[1]
A, B = 50, 40  # 2,000 branches

pytestmark = [pytest.mark.slow, pytest.mark.timeout(330)]  # slow: thousands of branches


def wide():
    src = Pipeline("wide").source(steps.source, seed=1)
    a = src.explore("a", grid(steps.add, n=list(range(A))))
    return a.explore("b", grid(steps.mul, n=list(range(B)))).choose("x", k=3)


def test_compiling_2000_branches_computes_each_key_once(monkeypatch):
    calls = []
    real = graph.compiling.compiler.step_key

    def counting(fn, params, inputs):
        calls.append(fn)
        return real(fn, params, inputs)

    monkeypatch.setattr(graph.compiling.compiler, "step_key", counting)
    c = graph.compile(wide())
    assert len(c.branches) == A * B
    # one key computation per step instance: the source once, each add once, each mul once
    assert len(calls) == 1 + A + A * B == c.unique_tasks == len(c.graph)
    assert c.naive_tasks == 3 * A * B  # the naive graph is only counted, never built
    assert len(c.metric_graph) == A * B
    assert len({b.key for b in c.branches}) == A * B
    assert all(len(b.lineage) == 3 for b in c.branches)
    # every dependency of every task is a task of the graph (nothing dangling, nothing duplicated)
    assert all(d in c.graph for t in c.graph.values() for d in t.dependencies)


def test_2000_branches_run_every_unique_task_once(client):
    result = wide().run(client, progress=False, quiet=True)
    s = result.stats
    assert s["branches"] == A * B and s["failed_branches"] == 0
    assert s["executed_tasks"] == s["unique_tasks"] == 1 + A + A * B
    assert s["metric_tasks"] == 0  # each metric is sent by its step's task (graph/tasks/fusedmetric.py)
    expected = sorted(((1 + a) * b for a in range(A) for b in range(B)), reverse=True)[:3]
    assert [v["x"] for v in result.value] == expected
    assert result.table["chosen"].sum() == 3 and (result.table["status"] == "ok").all()


def run_load(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python benchmarks/load.py ARGS`` from the repository root, its output captured."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "load.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_load_benchmark_quick(tmp_path):
    """The smoke mode runs both methods on the same tasks and its verdicts follow from its numbers."""
    out = tmp_path / "load.json"
    proc = run_load("--quick", "--sizes", "160", "320", "--output", str(out))  # its verdicts and counts, at any size
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["branches"] for r in rows] == [160, 320]
    for r in rows:
        a = r["branches"] // 40
        # plain Dask ran exactly the tasks Quiver ran before its choose; Quiver adds the 3 kept finals
        assert r["dask_tasks"] == 1 + a + r["branches"]  # source, "a" steps, "b" steps (sending their metrics)
        assert r["quiver_tasks"] == r["dask_tasks"] + 3
        for method in ("quiver", "dask"):
            (run,) = r["raw"][method]
            assert run["wall_s"] > 0 and run["cpu_s"] == pytest.approx(sum(run["cpu_split_s"].values()))
            assert run["cpu_split_s"]["workers"] > 0 and run["cpu_split_s"]["scheduler"] > 0
            assert r["raw"]["memory"][method]["scheduler_peak_growth_bytes"] > 0
        assert r["wall_ratio"] == pytest.approx(r["quiver_ms_per_task"] / r["dask_ms_per_task"])
    for name, t in data["targets"].items():
        limit = 1.5 if name == "scheduler_memory_per_branch" else 1.1
        assert t["met"] == (t["worst"] <= limit)
        assert f"target {name}:" in proc.stdout and ("-> met" if t["met"] else "-> NOT met") in proc.stdout


def test_load_benchmark_trivial_mode(tmp_path):
    """``--trivial``: n branches of one step returning {"m": i} and a choose, one task per branch
    (plus the source: the step sends its metric itself), both methods on the same tasks, and the
    target's verdict from the numbers."""
    out = tmp_path / "trivial.json"
    proc = run_load("--trivial", "30,60", "--repeats", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [r["branches"] for r in data["rows"]] == [30, 60]
    for r in data["rows"]:
        assert r["quiver_tasks"] == r["dask_tasks"] == r["branches"] + 1
        assert r["quiver_ms_per_branch"] == pytest.approx(1000 * r["quiver_wall_s"] / r["branches"])
    assert data["met"] is False  # no 10,000-branch row: nothing to meet
    bad = run_load("--trivial", "ten", timeout=60)
    assert bad.returncode == 2 and "--trivial takes branch counts" in bad.stderr
