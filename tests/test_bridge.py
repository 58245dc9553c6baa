"""The bridge (graph/cluster/bridge.py): a new embedded cluster's first tasks run in the user's process
while its workers start, every task runs once, the bridge retires for the workers, and a kept
cluster never has it.  Real LocalClusters, real processes."""

from __future__ import annotations

import os

import dask
import psutil
import pytest
from dask.task_spec import Task

import graph.cluster.embedded as embedded
from graph.cluster.bridge import eligible, enabled
from graph.tasks.iterative import iterative_task
from pipelines import Pipeline, grid
from tests import bridge_steps


def test_only_runs_of_plain_steps_get_a_bridge():
    def fit(x, lr):
        yield {"a": x * lr}

    plain = {"a": Task("a", len, [1])}
    assert eligible(plain, collections=False, modules=["sklearn.svm._classes", "numpy"])
    assert not eligible(plain, collections=True, modules=[])  # partitions would land in the user's process
    assert not eligible(plain, collections=False, modules=["gpu.train"])
    assert not eligible(plain, collections=False, modules=["torch.nn.modules.linear"])
    assert not eligible({**plain, "f": iterative_task(Task("f", fit, 2, lr=0.5))}, collections=False, modules=[])


def test_the_config_is_checked():
    with dask.config.set({"quiver.embedded-cluster.bridge": "yes"}):
        with pytest.raises(ValueError, match="quiver.embedded-cluster.bridge"):
            enabled()
    with dask.config.set({"quiver.embedded-cluster.bridge": False}):
        assert enabled() is False
    assert enabled() is True


def _exploration(n: int = 12):
    p = Pipeline("bridge")
    return (p.source(bridge_steps.source, seed=1)
            .explore("a", grid(bridge_steps.slow, a=list(range(n))))
            .choose("m", k=1, mode="max")
            .then(bridge_steps.test_step))


def test_a_first_run_starts_in_this_process_and_hands_over_to_the_workers():
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 60}):
        try:
            r = _exploration().run(quiet=True, progress=False, workers=2)
            assert r.stats["cluster"] == "started" and r.stats["bridge"] is True
            assert r.value["test"] == 2 * (1 + 11)  # the best branch, computed wherever it ran
            # every step ran exactly once: none was started on the bridge and again on a worker
            # (the source, the 12 branches, the chosen branch's test step)
            assert r.stats["executed_tasks"] == 1 + 12 + 1, r.stats
            embedded.settle_kept()
            client = embedded.kept()
            pids = set(client.run(os.getpid).values())
            assert os.getpid() not in pids and len(pids) == 2  # the kept cluster: its own two workers only
            again = _exploration().run(quiet=True, progress=False, workers=2)
            assert again.stats["cluster"] == "reused" and again.stats["bridge"] is False
            assert again.value["test"] == r.value["test"]
        finally:
            embedded.close_kept()


def test_where_the_steps_ran():
    # 16 steps of 0.5 s on one thread take longer than two workers' start, which a preload
    # holds back 3 s (tests/slow_worker_start.py: on a crowded CI minute the workers once came
    # before the bridge took a task): some steps ran in this process (the bridge), the rest on
    # the workers, and the source that the bridge computed reached the workers' steps (moved by
    # Dask, never recomputed)
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 0,
                          "distributed.worker.preload": ["tests.slow_worker_start"]}):
        node = (Pipeline("where").source(bridge_steps.source, seed=1)
                .explore("a", grid(bridge_steps.slow, a=list(range(16)), seconds=[0.5])))
        r = node.run(quiet=True, progress=False, workers=2)
    pids = [v["pid"] for v in r.values]
    sources = {v["source_pid"] for v in r.values}
    assert r.stats["bridge"] is True
    assert os.getpid() in pids, "no step ran in this process while the workers started"
    assert set(pids) - {os.getpid()}, "no step ran on the cluster's own workers"
    assert len(sources) == 1  # one source task, run once, wherever it ran
    assert r.stats["executed_tasks"] == r.stats["unique_tasks"] == 17
    assert r.stats["bridge_tasks"] == sum(p == os.getpid() for p in pids) + (next(iter(sources)) == os.getpid())


def test_the_config_turns_it_off():
    with dask.config.set({"quiver.embedded-cluster.bridge": False, "quiver.embedded-cluster.idle-timeout": 0}):
        node = (Pipeline("off").source(bridge_steps.source, seed=1)
                .explore("a", grid(bridge_steps.slow, a=[1, 2, 3], seconds=[0.01])))
        r = node.run(quiet=True, progress=False, workers=2)
    assert r.stats["bridge"] is False and r.stats["bridge_tasks"] == 0
    assert os.getpid() not in {v["pid"] for v in r.values}


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_start_retried_with_spawn_replaces_the_first_workers(monkeypatch):
    # graph.cluster.workerstart retries a failed forked start once with spawn, calling the cluster's
    # ``make`` again: under a bridge that reuses the scheduler already handed to the run, and the
    # first start's workers go before the new ones come
    import graph.cluster.workerstart as workerstart

    def forked_then_spawned(make, environ, modules=(), budgeted=False, meanwhile=None):
        make("forkserver")  # as if it had failed once its workers were up
        return make("spawn"), "spawn"

    monkeypatch.setattr(workerstart, "start_workers", forked_then_spawned)
    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 60}):
        try:
            node = (Pipeline("retried").source(bridge_steps.source, seed=1)
                    .explore("a", grid(bridge_steps.slow, a=[1, 2, 3, 4], seconds=[0.05])))
            r = node.run(quiet=True, progress=False, workers=2)
            assert r.stats["bridge"] is True
            assert sorted(v["m"] for v in r.values) == [2.0, 3.0, 4.0, 5.0]
            assert r.stats["executed_tasks"] == r.stats["unique_tasks"] == 5
            embedded.settle_kept()
            pids = set(embedded.kept().run(os.getpid).values())
            assert len(pids) == 2 and os.getpid() not in pids
            # the spawned two (children of this process, where forks are the fork server's); the forked two gone
            assert {psutil.Process(pid).ppid() for pid in pids} == {os.getpid()}
        finally:
            embedded.close_kept()


def test_a_retiring_bridge_serves_its_data_then_answers_busy(monkeypatch):
    # the drain before the bridge leaves the scheduler (graph/cluster/bridge.py): while workers keep
    # asking for its data it waits; asked during the first phase it serves the data, and once it
    # has drained it answers Dask's "busy" (the asker takes another holder), never an error
    import asyncio

    from distributed import Scheduler
    from distributed.worker import get_data_from_worker

    import graph.cluster.bridge as bridge
    from graph.cluster.bridge import _worker_class

    events: list[str] = []  # the order of what happened: requests served, the switch to "busy"
    refuse = bridge.refuse_transfers

    def recorded_refuse(worker):
        events.append("busy")
        return refuse(worker)

    monkeypatch.setattr(bridge, "refuse_transfers", recorded_refuse)

    async def main():
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            async with _worker_class()(s.address, nthreads=1, memory_limit=0, dashboard=False) as w:
                w.update_data({"x": 123})
                served = [await get_data_from_worker(w.rpc, ["x"], w.address)]  # Dask's copy, say
                # a limit no phase reaches here: the drain ends because the requests stopped
                drain = asyncio.create_task(w.drain(quiet=0.2, limit=600.0))
                for _ in range(6):  # a request every 0.05 s for 0.3 s: the drain must not end meanwhile
                    await asyncio.sleep(0.05)  # the pace of the requests under test, shorter than quiet
                    served.append(await get_data_from_worker(w.rpc, ["x"], w.address))
                    events.append("served")
                assert not drain.done()
                await asyncio.wait_for(drain, 60)  # a safety bound: a drain that waits for its limit fails here
                after = await get_data_from_worker(w.rpc, ["x"], w.address)
                return served, after

    served, after = asyncio.run(main())
    assert all(r["status"] == "OK" and r["data"] == {"x": 123} for r in served), served  # first phase: served
    # it switched to "busy" once, after a pause following the last request, never while they came
    assert events == ["served"] * 6 + ["busy"], events
    assert after == {"status": "busy"}
