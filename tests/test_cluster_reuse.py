"""The embedded cluster is kept between runs in one process (graph.cluster.embedded): a second
``run``/``fit`` finds its workers ready, an idle one is closed after its timeout, a failed
run's cluster is never handed on, and the process exits with no worker left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import psutil
import pytest

import graph.cluster.embedded as embedded
from pipelines import Pipeline, grid

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, os, sys
import graph.cluster.embedded as embedded
from pipelines import Pipeline, grid
from pipelines.sklearn import GridSearchCV
from sklearn.datasets import load_iris
from sklearn.svm import SVC

def src(seed):
    return seed

def add(x, a):
    return {"m": x + a}

best = Pipeline("reuse").source(src, seed=1).explore("s", grid(add, a=[1, 2])).choose("m")
seen = []
for _ in range(2):
    r = best.run(quiet=True, progress=False, workers=2)
    embedded.settle_kept()  # a first run may end before its workers are in (graph/cluster/bridge.py)
    seen.append({"cluster": r.stats["cluster"], "value": r.value["m"],
                 "pids": sorted(embedded.kept().run(os.getpid).values())})
X, y = load_iris(return_X_y=True)
fit = GridSearchCV(SVC(), {"C": [1, 10]}, cv=3, progress=False).fit(X, y)
seen.append({"cluster": fit.quiver_result_.stats["cluster"], "value": fit.best_score_,
             "pids": sorted(embedded.kept().run(os.getpid).values())})
print(json.dumps(seen))
'''


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_a_second_run_and_fit_reuse_the_workers_and_exit_leaves_none():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DASK_QUIVER__EMBEDDED_CLUSTER__IDLE_TIMEOUT", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second, fit = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["cluster"] == "started"
    assert second["cluster"] == "reused" and fit["cluster"] == "reused"  # the drop-in's default cluster too
    assert first["pids"] == second["pids"] == fit["pids"] and len(first["pids"]) == 2  # the same worker processes
    assert out.stderr.count("Invalid Worker.status") == 0  # the bridge's retirement is quiet
    assert "during heartbeat" not in out.stderr, out.stderr[-3000:]  # no heartbeat raced its close
    assert "Worker stream died" not in out.stderr, out.stderr[-3000:]  # no fetch from it was cut off
    assert first["value"] == second["value"] == 3
    assert _gone(first["pids"]), f"worker processes {first['pids']} outlived the script"


def _best():
    def src(seed):
        return seed

    def add(x, a):
        if a < 0:
            raise ValueError("negative")
        return {"m": x + a}

    return Pipeline("reuse").source(src, seed=1).explore("s", grid(add, a=[1, 2]))


def test_an_idle_kept_cluster_is_closed_after_its_timeout():
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 1}):
        r = _best().choose("m").run(quiet=True, progress=False, workers=1)
        assert r.stats["cluster"] == "started" and r.value["m"] == 3
        embedded.settle_kept()  # its own workers in, the bridge (this process) retired: graph/cluster/bridge.py
        client = embedded.kept()
        assert client is not None
        pids = list(client.run(os.getpid).values())
        assert os.getpid() not in pids
        assert _gone(pids, within=20), "the idle cluster's worker was not closed"
        assert embedded.kept() is None


def test_a_failed_runs_cluster_is_not_handed_on():
    import graph

    p = Pipeline("fails")
    bad = p.source(lambda seed: seed, seed=1).explore("s", grid(lambda x, a: 1 / 0, a=[1, 2])).choose("m")
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 60}):
        try:
            with pytest.raises(graph.RunError):
                bad.run(quiet=True, progress=False, workers=1)
            assert embedded.kept() is None
        finally:
            embedded.close_kept()


def test_a_different_shape_replaces_the_kept_cluster():
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 60}):
        try:
            one = _best().choose("m").run(quiet=True, progress=False, workers=1)
            embedded.settle_kept()
            first = embedded.kept()
            pids = list(first.run(os.getpid).values())
            two = _best().choose("m").run(quiet=True, progress=False, workers=2)
            embedded.settle_kept()
            assert (one.stats["cluster"], two.stats["cluster"]) == ("started", "started")
            assert len(embedded.kept().nthreads()) == 2 and embedded.kept() is not first
            assert _gone(pids), "the one-worker cluster was not closed when a two-worker run came"
        finally:
            embedded.close_kept()
