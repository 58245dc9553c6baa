"""Metric reads fused into their step's task, on a real cluster (graph/tasks/fusedmetric.py): a choose
gives the same table, chosen value and metrics as with a read task per branch, a trivial branch
is one task on the scheduler, a metric error reads as before, and a worker SIGKILLed after its
step sent the metric leaves the result unchanged."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin

from graph.errors import RunError
from graph.run.executor import execute
from pipelines import Pipeline, grid
from tests import steps
from graph.parcels import opened

pytestmark = pytest.mark.slow  # a real cluster


# ---- steps (importable by the workers) ----
def digits(seed=0):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return {"x": x[:600], "y": y[:600], "seed": seed}


def fit(data, C):
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    xa, xb, ya, yb = train_test_split(data["x"] / 16.0, data["y"], test_size=0.3, random_state=data["seed"])
    model = LogisticRegression(C=C, max_iter=200).fit(xa, ya)
    return {"accuracy": float(model.score(xb, yb)), "C": C, "model": model}


def summary(v):
    return {"accuracy": v["accuracy"], "C": v["C"]}


def trivial(x, i):
    return {"m": i}


class CountKeys(SchedulerPlugin):
    """Every key the scheduler was given (a task per key), by run."""

    name = "fused-test-count-keys"

    def __init__(self):
        self.keys: set = set()

    def update_graph(self, scheduler, *, keys=None, tasks=None, **kwargs):
        self.keys.update(map(str, tasks or keys or ()))


def _two_task(compiled):
    """The same compiled pipeline with every metric read by a task of its own (the path of a
    collection's metric): what a run did before reads were fused."""
    return dataclasses.replace(compiled, fused={})


def _same_tables(a, b):
    """Equal but for timings and infrastructure retries (a lost worker's reschedules are counted
    in a ``retries`` column, which a fault-free run does not have)."""
    infra = ("seconds", "retries")
    a = a.drop(columns=[c for c in infra if c in a.columns])
    b = b.drop(columns=[c for c in infra if c in b.columns])
    assert a.equals(b), (a, b)


def test_a_choose_gives_the_same_table_value_and_metrics_fused_or_not(client):
    node = (Pipeline("digits").source(digits).explore("fit", grid(fit, C=[0.01, 0.1, 1.0]))
            .choose("accuracy", k=1).then(summary))
    c = node.compile()
    assert len(c.fused) == 3  # each fit sends its own accuracy
    fused, two = execute(c, client, progress=False), execute(_two_task(c), client, progress=False)
    _same_tables(fused.table, two.table)
    expected = {C: fit(digits(), C)["accuracy"] for C in (0.01, 0.1, 1.0)}
    best = max(expected, key=expected.get)
    assert fused.values == two.values == [{"accuracy": expected[best], "C": best}]
    assert list(fused.table["accuracy"]) == [expected[C] for C in (0.01, 0.1, 1.0)]
    assert fused.stats["metric_tasks"] == 0 and two.stats["metric_tasks"] == 3


def test_a_trivial_branch_is_one_task_on_the_scheduler(client):
    node = Pipeline("one").source(steps.source).explore("i", grid(trivial, i=list(range(40)))).choose("m", k=1)
    plugin = CountKeys()
    client.register_plugin(plugin)
    try:
        counted = []
        for compiled in (node.compile(), _two_task(node.compile())):
            client.run_on_scheduler(_clear)
            result = execute(compiled, client, progress=False)
            assert result.values == [{"m": 39}]
            counted.append(client.run_on_scheduler(_count))
    finally:
        client.unregister_scheduler_plugin(CountKeys.name)
    assert counted == [1 + 40, 1 + 40 + 40]  # the source and a task per branch; before, a read task more


def _clear(dask_scheduler):
    dask_scheduler.plugins[CountKeys.name].keys.clear()


def _count(dask_scheduler):
    return len(dask_scheduler.plugins[CountKeys.name].keys)


def test_metric_errors_read_as_with_a_read_task(client):
    """A step's value without the metric key, or not a number: the same errors, failed step and
    statuses as the read task gave; the same mistake twice stops the run with the same message."""
    outs = [{"x": 1}, {"y": 2}, {"x": "abc"}, [3], {"x": 5}]
    node = Pipeline("errs").source(steps.source).explore("r", grid(steps.returns, what=outs)).choose("x")
    c = node.compile()
    runs = [execute(k, client, progress=False, on_metric_error="continue") for k in (c, _two_task(c))]
    _same_tables(*(r.table for r in runs))
    table = runs[0].table
    assert list(table["status"]) == ["ok", "failed", "failed", "failed", "ok"]
    assert list(table["chosen"]) == [False, False, False, False, True]
    assert table["failed_step"].tolist()[1:4] == ["choose('x')"] * 3
    assert "has no key 'x'" in table["error"].tolist()[1]
    stopping = Pipeline("errs2").source(steps.source).explore("r", grid(steps.returns, what=[{"y": 1}, {"y": 2}])).choose("x")
    messages = []
    for k in (stopping.compile(), _two_task(stopping.compile())):
        with pytest.raises(RunError) as err:
            execute(k, client, progress=False)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "failed for the same reason" in messages[0]


def test_a_worker_killed_after_its_step_sent_the_metric_leaves_the_result_unchanged():
    """SIGKILL the worker holding a finished step whose metric the run has: Dask computes the
    step again (it sends the metric again: counted once) and the run ends as a fault-free one."""
    from distributed import Client, LocalCluster

    node = Pipeline("kill").source(steps.source).explore("a", grid(steps.sleep_then, seconds=[0.3] * 1 + [0.31, 0.32,
                                                                                             0.33, 0.34, 0.35])) \
        .choose("x", k=2).then(steps.square)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cl, Client(cl) as c:
        clean = execute(node.compile(), c, progress=False)
        killed = []

        def killer(driver):
            def watch():
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not killed:
                    state = driver.state
                    for mk, step in list(state.c.fused.items()):
                        fut = driver.futures.get(step)
                        if mk in dict(state.metric_values) and fut is not None and fut.status == "finished":
                            holders = c.who_has([fut]).get(fut.key) or ()
                            if holders:
                                pid = c.run(os.getpid, workers=[holders[0]])[holders[0]]
                                os.kill(pid, signal.SIGKILL)
                                killed.append(step)
                                return
                    time.sleep(0.01)

            t = threading.Thread(target=watch, daemon=True)
            t.start()
            return t

        hit = execute(node.compile(), c, progress=False, on_driver=killer)
    assert killed, "no worker was killed"
    assert "retries" not in clean.table.columns
    _same_tables(clean.table, hit.table)
    assert clean.values == hit.values


def test_a_step_already_on_the_cluster_sends_nothing_and_its_metric_is_read_by_task(client):
    """The run submits a step whose result the cluster holds already (another holder's future):
    Dask does not run it, so no message comes; the run reads that metric with its task."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    node = Pipeline("held").source(steps.source).explore("a", grid(steps.add, n=[1, 2, 3])).choose("x", k=1)
    c = node.compile()
    first = c.chooses[0].inputs[0].key
    need = {k: c.graph[k] for k in c.chooses[0].inputs[0].lineage}
    held = client.get(HighLevelGraph({"held": MaterializedLayer(need)}, {"held": set()}), [first], sync=False)
    try:
        assert opened(client.gather(held)[0])["x"] == 1  # a step's value travels as a parcel
        result = execute(c, client, progress=False)
    finally:
        client.cancel(held)
    assert result.values == [{"path": "source(0)>add(3)", "x": 3}]
    assert list(result.table["x"]) == [1.0, 2.0, 3.0]
    assert result.stats["metric_tasks"] == 1  # the held step's read; the others came with their steps
