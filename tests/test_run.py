"""Running explorations on a real LocalCluster (worker processes on loopback)."""

from __future__ import annotations

import collections
import functools
import math

import pytest

from pipelines import Pipeline, RunError, combine, grid
from tests import steps

pytestmark = pytest.mark.timeout(120)


def run(node, client):
    return node.run(client, progress=False, quiet=True)


def xgrid_pipeline(log=None):
    """x = (seed + a) * b for a in 1..3, b in {1, 10}: six branches with known metrics."""
    src = Pipeline("x").source(steps.source, seed=0, log=log)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3], log=[log]))
    return a.explore("b", grid(steps.mul, n=[1, 10], log=[log]))


def expected_x():
    return [(a, b, a * b) for a in (1, 2, 3) for b in (1, 10)]


# ---- every unique step runs exactly once ---------------------------------------------------------


def test_each_unique_step_runs_exactly_once(client, log_dir):
    src = Pipeline("once").source(steps.source, seed=1, log=log_dir)
    a = src.explore("a", grid(steps.add, n=[1, 2], log=[log_dir]), sq=functools.partial(steps.square, log=log_dir))
    b = a.explore("b", grid(steps.mul, n=[2, 3], log=[log_dir]))
    c = src.explore("c", grid(steps.add, n=[5, 6], log=[log_dir]))
    joined = combine(steps.join, left=b, right=a, log=log_dir)      # joined on "a": 3 x 2
    crossed = combine(steps.join, left=joined, right=c, log=log_dir)  # crossed with "c": 6 x 2
    result = run(crossed, client)

    done = steps.executions(log_dir)
    counts = collections.Counter(done)
    assert max(counts.values()) == 1, [p for p, n in counts.items() if n > 1]
    # distinct work, counted by hand: 1 source, 3 "a", 6 "b", 2 "c", 6 joins, 12 joins
    assert len(done) == 1 + 3 + 6 + 2 + 6 + 12
    assert result.stats["executed_tasks"] == len(done)
    assert result.stats["unique_tasks"] == len(done)
    assert result.stats["naive_tasks"] > result.stats["unique_tasks"]
    assert len(result.table) == 12
    assert (result.table["status"] == "ok").all()
    # every branch value is the join of the right inputs
    for value in result.values:
        assert value["path"].count("source(1)") == 3


def test_table_columns_follow_the_contract(client):
    result = run(xgrid_pipeline().choose("x", k=2), client)
    t = result.table
    for col in ["a", "b", "a.n", "b.n", "x", "status", "seconds", "chosen", "error", "traceback"]:
        assert col in t.columns
    assert list(t["a"].unique()) == ["add"] and list(t["b"].unique()) == ["mul"]
    assert [(r["a.n"], r["b.n"]) for _, r in t.iterrows()] == [(a, b) for a, b, _ in expected_x()]
    assert list(t["x"]) == [x for _, _, x in expected_x()]
    assert (t["seconds"] >= 0).all()


# ---- choose modes --------------------------------------------------------------------------------


def test_single_best(client):
    result = run(xgrid_pipeline().choose("x"), client)
    best = max(expected_x(), key=lambda r: r[2])
    assert result.value["x"] == best[2]
    assert result.table["chosen"].sum() == 1
    row = result.chosen.iloc[0]
    assert (row["a.n"], row["b.n"]) == best[:2]
    assert result.stats["executed_tasks"] == 1 + 3 + 6


def test_top_k_values_best_first(client):
    result = run(xgrid_pipeline().choose("x", k=3), client)
    expected = sorted((x for _, _, x in expected_x()), reverse=True)[:3]
    assert [v["x"] for v in result.value] == expected
    assert sorted(result.chosen["x"], reverse=True) == expected


def test_mode_min(client):
    result = run(xgrid_pipeline().choose("x", mode="min"), client)
    assert result.value["x"] == min(x for _, _, x in expected_x())


def test_threshold_keeps_all_at_or_past_it(client):
    result = run(xgrid_pipeline().choose("x", threshold=10), client)
    expected = sorted((x for _, _, x in expected_x() if x >= 10), reverse=True)
    assert [v["x"] for v in result.value] == expected
    result = run(xgrid_pipeline().choose("x", mode="min", threshold=2), client)
    assert [v["x"] for v in result.value] == [1, 2]


def test_per_group(client):
    result = run(xgrid_pipeline().choose("x", per="b", k=1), client)
    by_b = collections.defaultdict(list)
    for a, b, x in expected_x():
        by_b[b].append(x)
    assert sorted(v["x"] for v in result.value) == sorted(max(xs) for xs in by_b.values())
    assert result.table.groupby("b.n")["chosen"].sum().to_dict() == {1: 1, 10: 1}


def test_ties_go_to_the_branch_declared_first(client):
    # x % 10: (1,1)=1 (1,10)=0 (2,1)=2 (2,10)=0 (3,1)=3 (3,10)=0 -> three-way tie at 0 for "min"
    result = run(xgrid_pipeline().choose(steps.x_mod_10, mode="min"), client)
    tied = [i for i, (_, _, x) in enumerate(expected_x()) if x % 10 == 0]
    assert len(tied) == 3
    assert list(result.chosen.index) == [tied[0]]
    assert "x_mod_10" in result.table.columns


def test_downstream_step_runs_only_on_kept_branches(client, log_dir):
    node = xgrid_pipeline(log_dir).choose("x", k=2).then(steps.square, log=log_dir)
    result = run(node, client)
    squared = [p for p in steps.executions(log_dir) if p.endswith(">square")]
    assert len(squared) == 2
    assert sorted(v["x"] for v in result.value) == sorted(x * x for x in (20, 30))
    assert (result.table["status"] == "dropped").sum() == 4
    assert result.stats["executed_tasks"] == 1 + 3 + 6 + 2


def test_nested_chooses(client):
    src = Pipeline("nest").source(steps.source, seed=0)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3])).choose("x", k=2)  # keeps a=3, a=2
    b = a.explore("b", grid(steps.mul, n=[1, 10])).choose("x", mode="min")  # min of {3,30,2,20}
    result = run(b, client)
    assert result.value["x"] == 2
    assert result.stats["executed_tasks"] == 1 + 3 + 4


def test_first_k_above_threshold_cancels_the_rest(log_dir):
    src = Pipeline("fk").source(steps.source, seed=0)
    node = src.explore("a", grid(steps.add, n=[10, 11, 12, 13], log=[log_dir]), slow=steps.mark_slow)
    for _ in range(6):  # milliseconds for the fast branches, six half-second naps for the slow one
        node = node.then(steps.nap_if_slow, seconds=0.5, log=log_dir)
    # every branch reaches the threshold (the slow one with x=20), but only the first two count.
    # Two threads: a fast task never waits behind a nap of the slow branch on a busy thread.
    result = node.choose("x", k=2, threshold=10).run(workers=1, threads_per_worker=2, progress=False, quiet=True)
    t = result.table
    assert t["chosen"].sum() == 2
    assert set(t.loc[t["chosen"], "a"]) == {"add"}
    assert (t.loc[t["chosen"], "x"] >= 10).all()
    assert t.set_index("a").loc["slow", "status"] == "cancelled"
    # the slow branch was stopped before its last step
    assert "source(0)>slow" + ">nap" * 6 not in steps.executions(log_dir)
    assert result.stats["executed_tasks"] < result.stats["unique_tasks"]
    assert len(result.value) == 2


# ---- failures ------------------------------------------------------------------------------------


def test_failing_branch_is_isolated(client):
    node = xgrid_pipeline().then(steps.fail_on, bad=30).choose("x")
    result = run(node, client)
    t = result.table
    failed = t[t["status"] == "failed"]
    assert len(failed) == 1 and failed.iloc[0]["x"] is None or math.isnan(failed.iloc[0]["x"])
    assert "ValueError: refusing x=30" in failed.iloc[0]["error"]
    assert "fail_on" in failed.iloc[0]["traceback"] and failed.iloc[0]["failed_step"] == "fail_on"
    assert (t.loc[t["status"] != "failed", "status"] == "ok").all()
    assert result.value["x"] == 20  # best among the survivors


def test_metric_on_a_non_mapping_fails_that_branch_clearly(client):
    src = Pipeline("nm").source(steps.source)
    node = src.explore("a", good=functools.partial(steps.add, n=1), bad=steps.not_a_mapping).choose("x")
    result = run(node, client)
    bad = result.table.set_index("a").loc["bad"]
    assert bad["status"] == "failed"
    assert "must be a mapping" in bad["error"] and "returned list" in bad["error"]
    assert result.value["x"] == 1


def test_every_branch_failing_raises_with_the_table(client):
    node = xgrid_pipeline().then(steps.always_fail).choose("x")
    with pytest.raises(RunError, match=r"every branch failed \(6 of 6\).*always_fail.*RuntimeError") as info:
        run(node, client)
    assert len(info.value.table) == 6
    assert (info.value.table["status"] == "failed").all()


def test_nan_metrics_rank_last(client):
    def nan_for_b10(v):
        return float("nan") if v["x"] >= 10 else v["x"]

    result = run(xgrid_pipeline().choose(nan_for_b10, k=6), client)
    xs = [v["x"] for v in result.value]
    assert xs == [3, 2, 1]  # NaN branches are never kept by k
    assert result.table["chosen"].sum() == 3


# ---- the embedded cluster ------------------------------------------------------------------------


def test_run_without_client_uses_an_embedded_cluster(capsys):
    result = xgrid_pipeline().choose("x").run(workers=1, progress=False)
    assert result.value["x"] == 30
    err = capsys.readouterr().err
    assert "embedded LocalCluster (1 workers)" in err and "http://127.0.0.1:" in err


def test_run_with_a_scheduler_address(client):
    result = xgrid_pipeline().choose("x").run(client.scheduler.address, progress=False, quiet=True)
    assert result.value["x"] == 30


def test_progress_bar_is_drawn_when_asked(client, capsys):
    xgrid_pipeline().choose("x").run(client, progress=True, quiet=True)
    err = capsys.readouterr().err
    assert "[quiver]" in err and "branches 6/6" in err and "best x=30" in err


# ---- worker loss -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_killing_a_worker_mid_run_gives_the_same_table():
    import os
    import signal
    import threading

    from distributed import Client, LocalCluster

    def node():
        a = Pipeline("kill").source(steps.source, seed=1).explore("a", grid(steps.add, n=[1, 2, 3, 4]))
        b = a.explore("b", grid(steps.mul, n=[1, 10]))
        return b.then(steps.sleep_then, seconds=0.4).choose("x", k=3)

    cols = ["a.n", "b.n", "x", "status", "chosen"]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        reference = run(node(), c)
        pids = c.run(os.getpid)
        victim = pids[sorted(pids)[1]]
        timer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))  # mid-run: 8 naps of 0.4 s on 2 workers
        timer.start()
        try:
            result = run(node(), c)
        finally:
            timer.cancel()
    assert result.table[cols].equals(reference.table[cols])
    assert [v["x"] for v in result.value] == [v["x"] for v in reference.value]
    # Dask recomputed what the dead worker held; the scheduler-side count shows it
    assert result.stats["executed_tasks"] > reference.stats["executed_tasks"]
