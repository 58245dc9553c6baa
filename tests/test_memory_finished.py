"""A budgeted worker forgets the run_spec of a task that has run (graph.memory.finished): the rule
with literal inputs, then a real worker process with the budget's worker plugin, where a released
task kept in the worker's state by its dependent has no spec left, and runs again when asked."""

from __future__ import annotations

import time
from operator import add

import pytest
from distributed import Client, LocalCluster

from graph.memory.finished import RAN, drop_finished_spec
from graph.memory.workmeter import WorkingMemoryPlugin


class _TS:
    def __init__(self) -> None:
        self.run_spec = object()


@pytest.mark.parametrize("start", sorted(RAN))
def test_a_task_that_ran_into_memory_forgets_its_spec(start):
    tasks = {"k": _TS()}
    assert drop_finished_spec(tasks, "k", start, "memory") is True
    assert tasks["k"].run_spec is None


@pytest.mark.parametrize("start, finish", [("waiting", "ready"), ("ready", "executing"), ("executing", "error"),
                                           ("executing", "cancelled"), ("flight", "memory"), ("executing", "released")])
def test_every_other_transition_keeps_it(start, finish):
    tasks = {"k": _TS()}
    assert drop_finished_spec(tasks, "k", start, finish) is False
    assert tasks["k"].run_spec is not None


def test_an_unknown_key_is_left_alone():
    assert drop_finished_spec({}, "gone", "executing", "memory") is False


def _specs(dask_worker, keys):
    return {k: (dask_worker.state.tasks[k].state, dask_worker.state.tasks[k].run_spec is None)
            for k in keys if k in dask_worker.state.tasks}


def test_on_a_worker_a_released_task_kept_by_its_dependent_has_no_spec_and_runs_again():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        c.register_plugin(WorkingMemoryPlugin("quiver-working-test"))
        x = c.submit(add, 1, 2, key="x")
        y = c.submit(add, x, 10, key="y")
        assert y.result() == 13
        del x  # released on the worker, but kept in its state: y (in memory) read it
        deadline = time.monotonic() + 30
        while True:
            (state,) = c.run(_specs, keys=["x", "y"]).values()
            if state["x"][0] == "released" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert state == {"x": ("released", True), "y": ("memory", True)}
        again = c.submit(add, 1, 2, key="x")  # the scheduler sends x's spec anew
        assert again.result() == 3
        assert c.submit(add, again, y, key="z").result() == 16
