"""The opt-in result store (graph/tasks/store.py, applied by graph/compiling/transform.py): resumable explorations keyed by deterministic task keys,
and steps marked not_rerunnable failing their branch instead of running twice after a worker loss."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import pytest

from graph.tasks.store import ResultStore
from pipelines import Pipeline, PipelineError, grid
from tests import steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # slow: runs and reruns with a store

COLS = ["a.n", "b.n", "x", "status", "chosen"]


def explore(log, a=(1, 2, 3), b=(1, 10)):
    src = Pipeline("st").source(steps.source, seed=0, log=log)
    node = src.explore("a", grid(steps.add, n=list(a), log=[log]))
    return node.explore("b", grid(steps.mul, n=list(b), log=[log])).choose("x", k=2).then(steps.square, log=log)


def run(node, client, store):
    return node.run(client, progress=False, quiet=True, store=store)


def test_second_run_loads_everything_and_gives_the_same_table(client, log_dir, tmp_path):
    store = tmp_path / "store"
    first = run(explore(log_dir), client, store)
    ran = len(steps.executions(log_dir))
    assert ran == first.stats["executed_tasks"] == 1 + 3 + 6 + 2
    assert first.stats["loaded_from_store"] == 0
    assert first.stats["saved_to_store"] == ran + 6  # the steps and the six choose metrics
    assert len(ResultStore(store)) == first.stats["saved_to_store"]

    second = run(explore(log_dir), client, store)
    assert len(steps.executions(log_dir)) == ran  # nothing ran again
    assert second.stats["executed_tasks"] == 0 and second.stats["saved_to_store"] == 0
    # the six metrics and the two kept branches' final values: nothing upstream is even loaded
    assert second.stats["loaded_from_store"] == 6 + 2
    assert second.table[COLS].equals(first.table[COLS])
    assert [v["x"] for v in second.value] == [v["x"] for v in first.value] == [900, 400]
    assert second.stats["naive_tasks"] == first.stats["naive_tasks"]
    assert second.stats["unique_tasks"] == first.stats["unique_tasks"]


def test_adding_branches_runs_only_the_new_work(client, log_dir, tmp_path):
    store = tmp_path / "store"
    run(explore(log_dir), client, store)
    before = collections.Counter(steps.executions(log_dir))
    grown = run(explore(log_dir, a=(1, 2, 3, 4), b=(1, 10, 100)), client, store)
    new = collections.Counter(steps.executions(log_dir)) - before
    # new: add(4), mul(100) on a=1..3, mul(1|10|100) on a=4, then square on the two new best
    assert sorted(p.split(">")[-1] for p in new.elements()) == sorted(
        ["add(4)", "mul(100)", "mul(100)", "mul(100)", "mul(1)", "mul(10)", "mul(100)", "square", "square"]
    )
    assert grown.stats["executed_tasks"] == sum(new.values())
    assert [v["x"] for v in grown.value] == [400**2, 300**2]
    assert len(grown.table) == 12


def test_a_crash_resumes_from_what_finished(client, log_dir, tmp_path):
    store = tmp_path / "store"
    flag = tmp_path / "broken"
    flag.write_text("1")

    def node():
        base = explore(log_dir).spec.input.input  # the six branches before the choose
        from pipelines.builder import Node

        return Node(base).then(steps.fail_while, flag=str(flag), bad=30).choose("x")

    first = run(node(), client, store)
    assert (first.table["status"] == "failed").sum() == 1
    flag.unlink()  # "fix" the environment and run again: only the failed branch's step reruns
    before = len(steps.executions(log_dir))
    second = run(node(), client, store)
    assert second.stats["executed_tasks"] == 1
    assert len(steps.executions(log_dir)) == before  # fail_while does not log; nothing else ran
    assert (second.table["status"] == "ok").all() and second.value["x"] == 30


def test_editing_a_step_invalidates_it_and_everything_downstream(client, log_dir, tmp_path):
    store = tmp_path / "store"

    def make(body):
        ns = {"__name__": "quiver_edited_steps"}  # not importable: shipped by value, like a user's file
        exec(f"def bump(v, log=None):\n    return dict(v, x={body})\n", ns)
        return ns["bump"]

    def node(bump):
        src = Pipeline("edit").source(steps.source, seed=0, log=log_dir)
        a = src.explore("a", grid(steps.add, n=[1, 2], log=[log_dir])).then(bump)
        return a.then(steps.square, log=log_dir).choose("x")

    old, new = make("v['x'] + 1"), make("v['x'] + 100")
    assert node(old).compile().graph.keys() != node(new).compile().graph.keys()
    first = run(node(old), client, store)
    assert first.value["x"] == (2 + 1) ** 2
    n = len(steps.executions(log_dir))
    before = collections.Counter(steps.executions(log_dir))
    again = run(node(old), client, store)
    assert again.stats["executed_tasks"] == 0 and len(steps.executions(log_dir)) == n
    edited = run(node(new), client, store)
    assert edited.value["x"] == (2 + 100) ** 2
    # source and both adds come from the store; both bumps and both squares run again
    assert edited.stats["executed_tasks"] == 4
    new_runs = collections.Counter(steps.executions(log_dir)) - before
    assert sorted(p.split(">")[-1] for p in new_runs.elements()) == ["square", "square"]


def test_unpicklable_values_are_used_but_not_stored(tmp_path):
    from graph.tasks.store import StoreWarning
    from graph.compiling.transform import SaveResult

    store = ResultStore(tmp_path / "store")
    wrapped = SaveResult(steps.with_lock, store.file("with_lock-1"), "with_lock-1")
    with pytest.warns(StoreWarning, match="not saving 'with_lock-1'.*cannot be pickled"):
        value = wrapped({"path": "p", "x": 1})
    assert value["x"] == 1 and "with_lock-1" not in store and len(store) == 0
    assert store.save("fine-1", {"x": 1}) and store.load("fine-1") == {"x": 1}


def test_store_files_are_atomic_and_a_corrupt_one_fails_its_branch_clearly(client, tmp_path):
    store = ResultStore(tmp_path / "store")
    node = Pipeline("c").source(steps.source).explore("a", grid(steps.add, n=[1, 2])).choose("x", k=2)
    run(node, client, store)
    assert not [n for n in os.listdir(store.path) if n.endswith(".tmp")]
    key = node.compile().branches[1].key
    with open(store.file(key), "wb") as f:
        f.write(b"not a pickle")
    result = run(node, client, store)
    bad = result.table.loc[1]
    assert bad["status"] == "failed" and "StoreError" in bad["error"] and "Delete that file" in bad["error"]
    assert result.table.loc[0, "status"] == "ok"


def test_a_bad_store_path_is_refused_before_anything_runs(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    node = Pipeline("p").source(steps.source).explore("a", grid(steps.add, n=[1]))
    with pytest.raises(PipelineError, match="not a directory"):
        node.run(store=str(f))
    with pytest.raises(PipelineError, match="directory path"):
        node.run(store=3)


# ---- steps that must not run twice ------------------------------------------------------------


def test_a_not_rerunnable_step_fails_its_branch_after_a_worker_loss(log_dir):
    from distributed import Client, LocalCluster

    node = (
        Pipeline("once")
        .source(steps.source, seed=1)
        .explore("pay", grid(steps.charge_card, log=[log_dir], seconds=[3]), cash=steps.square)
        .choose("x", k=2)
    )

    def kill_the_charging_worker():
        deadline = time.time() + 30
        while time.time() < deadline:
            started = [p for p in steps.executions(log_dir) if p.startswith("pid=")]
            if started:
                os.kill(int(started[0][4:]), signal.SIGKILL)
                return
            time.sleep(0.05)

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        killer = threading.Thread(target=kill_the_charging_worker, daemon=True)
        killer.start()
        result = node.run(c, progress=False, quiet=True)
        killer.join(5)
    t = result.table.set_index("pay")
    assert t.loc["charge_card", "status"] == "failed"
    assert "RerunRefused" in t.loc["charge_card", "error"] and "not_rerunnable" in t.loc["charge_card", "error"]
    assert t.loc["cash", "status"] == "ok" and t.loc["cash", "chosen"]
    assert len([p for p in steps.executions(log_dir) if p.startswith("pid=")]) == 1  # started once, never again
