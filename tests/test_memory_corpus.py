"""A corpus workload in CI (issue 46): issue 46's ridge exploration, written as a user writes
dask.array code (benchmarks/memory_corpus.py), on a cluster whose memory it does not fit, run as
Quiver with a budget and as one plain ``dask.compute`` of the same branches on the same cluster.
Behaviour only: bytes written to disk, tasks executed, the same choice; never elapsed time."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # each workload's plain-Dask run and Quiver's: tens of seconds

MiB = 2**20


def _runs(workload: str):
    import dask
    from distributed import Client, LocalCluster

    from benchmarks import memory_corpus as mc
    from benchmarks.collections_explore import Measured

    worker = 512 * MiB  # 2 x 512 MiB workers: results may use about 110 MiB of each
    if workload == "ridge":  # 112 MiB of source in 12 chunks
        branches, pipeline, key, metric = mc.ridge_branches(12, 20_000), mc.ridge_pipeline(12, 20_000), mc.ridge_row_key, "accuracy"
    else:  # 238 MiB of seeded chunks (25 x 12,500 x 100 float64)
        branches, pipeline, metric = mc.arrays_branches(25), mc.arrays_pipeline(25), "share"
        key = mc._arrays(1.0)["row_key"]
    out = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", memory_limit=worker) as lc, Client(lc) as client:
        with Measured(client) as m:
            values = dict(zip(branches, map(float, dask.compute(*branches.values()))))
        out["dask"] = dict(m.result, chosen=max(values, key=values.get))
        with Measured(client) as m:
            r = pipeline.run(client, memory_budget=2 * worker, progress=False, quiet=True)
        scores = {key(row): float(row[metric]) for _, row in r.table.iterrows()}
        out["quiver"] = dict(m.result, chosen=max(scores, key=scores.get), stats=r.stats, plan=str(r.memory_plan))
    return out


@pytest.fixture(scope="module")
def ridge_runs():
    return _runs("ridge")


@pytest.fixture(scope="module")
def array_runs():
    return _runs("arrays")


def test_arrays_quiver_chooses_as_plain_dask_and_runs_each_task_about_once(array_runs):
    q, d = array_runs["quiver"], array_runs["dask"]
    assert q["chosen"] == d["chosen"]
    assert q["executed_tasks"] <= 1.1 * q["distinct_keys"], (q["executed_tasks"], q["distinct_keys"])


@pytest.mark.xfail(strict=False, reason="holds on a quiet machine (0 spilled against plain Dask's 835 MiB in the "
                   "corpus), not beside other tests: 567 MB against plain Dask's 260 MB in a two-process test run "
                   "(2026-12-07); which results spill depends on the two workers' timing; open (issue 46)")
def test_arrays_quiver_spills_no_more_than_plain_dask(array_runs):
    q, d = array_runs["quiver"], array_runs["dask"]
    assert q["spilled_bytes"] <= d["spilled_bytes"] + 8 * MiB, (q["spilled_bytes"], d["spilled_bytes"])


@pytest.mark.xfail(strict=False, reason="issue 46's ridge still spills more than plain Dask (the workers' spill buffer "
                   "at the plan's target: 2.6 GB against 0.9 GB here, 24-29 GiB against 19 GiB at 745 MiB); open")
def test_ridge_quiver_spills_no_more_than_plain_dask_and_runs_each_task_about_once(ridge_runs):
    q, d = ridge_runs["quiver"], ridge_runs["dask"]
    assert q["chosen"] == d["chosen"]
    assert q["spilled_bytes"] <= d["spilled_bytes"] + 8 * MiB, (q["spilled_bytes"], d["spilled_bytes"])
    assert q["executed_tasks"] <= 1.1 * q["distinct_keys"], (q["executed_tasks"], q["distinct_keys"])


def test_the_plan_counts_views_once_and_says_why(ridge_runs):
    s = ridge_runs["quiver"]["stats"]
    assert s["planned_views"] > 0  # slices, transposes, da.concatenate's blocks: no bytes of their own
    assert "views or aliases" in ridge_runs["quiver"]["plan"]
    why = s["memory_why"]
    assert "planned:" in why and "by its memory monitor" in why and "past the plan's target" in why
    assert s["monitor_spilled_bytes"] + s["target_spilled_bytes"] == s["spilled_bytes"]
    assert "after the run:" in ridge_runs["quiver"]["plan"]
