"""Gangs (gpu.gang): rank order, atomic admission (no deadlock), from inside a task, failures."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gpu.gang import GangContext, GangError, run_gang, run_gang_timed
from tests.conftest import wait_for

pytestmark = pytest.mark.slow  # gangs of long-running tasks


def worker_addresses(client) -> list[str]:
    return sorted(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def whoami(ctx: GangContext, tag, *, scale=1):
    from distributed import get_worker

    assert get_worker().address == ctx.worker == ctx.workers[ctx.rank]
    t = torch.tensor([float(ctx.rank + 1)]) * scale
    ctx.collective.allreduce_(t)
    return tag, ctx.rank, ctx.size, ctx.worker, t.item()


def test_results_come_back_in_rank_order(client):
    workers = worker_addresses(client)
    results = run_gang(client, whoami, workers[::-1], "x", scale=2)
    assert [r[1] for r in results] == [0, 1]
    assert [r[3] for r in results] == workers[::-1]
    assert all(r[0] == "x" and r[2] == 2 and r[4] == 6.0 for r in results)


def test_gang_of_one(client):
    worker = worker_addresses(client)[0]
    assert run_gang(client, whoami, [worker], "solo") == [("solo", 0, 1, worker, 1.0)]


def test_bad_worker_lists_are_clear_errors(client):
    worker = worker_addresses(client)[0]
    with pytest.raises(ValueError, match="distinct"):
        run_gang(client, whoami, [worker, worker], "x")
    with pytest.raises(ValueError, match="unknown workers"):
        run_gang(client, whoami, ["tcp://127.0.0.1:1"], "x")


def slow_member(ctx, rounds):
    total = 0.0
    for _ in range(rounds):
        t = torch.ones(1000)
        ctx.collective.allreduce_(t)
        total += t[0].item()
        time.sleep(0.05)
    return total


def blocker(seconds):
    time.sleep(seconds)
    return "done"


@pytest.mark.timeout(120)
def test_two_gangs_launched_together_both_complete(client):
    """The deadlock atomic admission prevents, set up deterministically: gang A holds worker
    0 and waits for worker 1 (busy); gang B, launched from another thread meanwhile with a
    higher priority and its ranks reversed, would jump the queue on worker 1 and wait for
    worker 0 forever. (Without the admission lock this deadlocks until admission_timeout.)"""
    w0, w1 = worker_addresses(client)
    busy = client.submit(blocker, 1.5, workers=[w1], pure=False)
    results, errors = {}, []

    def launch(name, order, priority):
        try:
            results[name] = run_gang(client, slow_member, order, 5, timeout=20, priority=priority,
                                     admission_timeout=60)
        except BaseException as e:  # reported below
            errors.append(e)

    a = threading.Thread(target=launch, args=("a", [w0, w1], 0))
    b = threading.Thread(target=launch, args=("b", [w1, w0], 10))
    wait_for(lambda: client.processing()[w1], what="the blocker to run on worker 1")
    a.start()
    # gang A's rank 0 holds worker 0 (it waits there for rank 1) before B is launched
    wait_for(lambda: client.processing()[w0], what="gang A's rank 0 to start on worker 0")
    b.start()
    for t in (a, b):
        t.join(100)
    assert not a.is_alive() and not b.is_alive(), "gangs deadlocked"
    assert not errors, errors
    assert results == {"a": [10.0, 10.0], "b": [10.0, 10.0]}
    assert busy.result() == "done"


def test_many_gangs_from_many_threads(client):
    workers = worker_addresses(client)
    out, barrier = [], threading.Barrier(3)

    def launch(i):
        barrier.wait()
        for k in range(2):
            out.append(run_gang(client, slow_member, workers[:: (-1) ** (i + k)], 2, timeout=20))

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert out == [[4.0, 4.0]] * 6


def launch_from_task(n):
    """A pipeline step that trains: runs as a task, starts a gang over every worker."""
    return run_gang(None, whoami, None, "inner", scale=n)


def test_run_gang_from_inside_a_task(client):
    # the calling task occupies one of the two 1-thread workers: it must secede
    results = client.submit(launch_from_task, 3, pure=False).result(timeout=60)
    assert [r[1] for r in results] == [0, 1]
    assert all(r[4] == 9.0 for r in results)


@pytest.mark.timeout(60)
def test_admission_timeout_when_a_worker_stays_busy(client):
    workers = worker_addresses(client)
    busy = client.submit(blocker, 4.0, workers=[workers[1]], pure=False)
    wait_for(lambda: client.processing()[workers[1]], what="the blocker to run on worker 1")
    with pytest.raises(GangError, match="did not start within admission_timeout") as info:
        run_gang(client, whoami, workers, "x", admission_timeout=1.5)
    assert info.value.rank == 1 and info.value.worker == workers[1]
    assert busy.result(timeout=30) == "done"
    # the cluster is fine afterwards: the aborted gang left nothing behind
    assert [r[4] for r in run_gang(client, whoami, workers, "y")] == [3.0, 3.0]


def test_timings_tell_waiting_for_a_busy_worker_from_admission(client):
    workers = worker_addresses(client)
    busy = client.submit(blocker, 1.5, workers=[workers[1]], pure=False)
    wait_for(lambda: client.processing()[workers[1]], what="the blocker to run")  # rank 1 cannot start yet
    results, t = run_gang_timed(client, whoami, workers, "t")
    assert [r[4] for r in results] == [3.0, 3.0] and busy.result() == "done"
    assert set(t) == {"lock_s", "wait_s", "admission_s", "run_s"}
    # rank 1 started only once the blocker ended: that wait is queueing, and is part of admission
    assert 0 < t["wait_s"] <= t["admission_s"] - t["lock_s"]
    assert t["run_s"] > 0


def failing_member(ctx):
    if ctx.rank == 0:
        raise KeyError("missing data on rank 0")
    ctx.collective.barrier()


def test_member_failure_names_the_rank(client):
    with pytest.raises(GangError, match="rank 0") as info:
        run_gang(client, failing_member, timeout=30)
    assert isinstance(info.value.exception, KeyError)
    assert set(info.value.errors) == {0, 1}
