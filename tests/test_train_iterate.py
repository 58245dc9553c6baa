"""gpu.train as an iterative step: one report per epoch, stopped at an epoch boundary, gangs
that do not serialise branches (real torch, real digits, real LocalCluster with processes).

Orderings are proven by evidence the steps leave (files, the training events' epoch counts),
never by timing.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

import gpu
from gpu.training import iterate, pick_workers, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # slow: torch training as an iterative step

MLP = functools.partial(gpu.MLP, 64, 10, hidden=(16,))
WAIT = 120.0  # seconds a step waits for the other's file before failing (a hang, not a timing check)


@pytest.fixture(scope="module")
def digits():
    return gpu.load_digits_tensors(seed=0)


# ---- steps (run on the workers) ----------------------------------------------------------------
def close_after(data, n: int, kwargs: dict) -> dict:
    """Take ``n`` reports of a long gang training, then close it (what a pruned branch gets)."""
    gen = iterate(data, model=MLP, **kwargs)
    seen = [next(gen)["epoch"] for _ in range(n)]
    gen.close()
    from distributed import get_worker

    return {"seen": seen, "task": get_worker().get_current_task()}


def meets(data, me: str, other: str, log_dir: str, kwargs: dict):
    """An iterative step over gpu.train: after its first epoch it leaves a file and waits for
    ``other``'s; if the two trainings ran one after the other, the first would wait forever."""
    gen = iterate(data, model=MLP, **kwargs)
    for rec in gen:
        yield rec
        if rec["epoch"] == 1:
            Path(log_dir, me).write_text("1")
            deadline = time.monotonic() + WAIT
            while not Path(log_dir, other).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{me} never saw {other} train: the branches ran one after the other")
                time.sleep(0.01)
    return {"me": me}


def drive(data, me, other, log_dir, kwargs) -> dict:
    out = yield from meets(data, me, other, log_dir, kwargs)
    return out


# ---- in this process ---------------------------------------------------------------------------
def test_iterate_reports_every_epoch_and_returns_what_train_returns(digits):
    kw = dict(model=MLP, epochs=3, lr=0.05, batch_size=32, replicas=2, workers=1, seed=4)
    gen = iterate(digits, **kw)
    reports = []
    try:
        while True:
            reports.append(next(gen))
    except StopIteration as end:
        out = end.value
    solo = train(digits, **kw)
    assert [r["epoch"] for r in reports] == [1, 2, 3]
    assert [r["accuracy"] for r in reports] == [h["accuracy"] for h in solo["history"]]
    assert all(r["loss"] == r["train_loss"] for r in reports)
    assert all(isinstance(v, (int, float, str)) for r in reports for v in r.values())
    assert out["accuracy"] == solo["accuracy"] == reports[-1]["accuracy"]
    assert train.__quiver_iterative__ and train.__quiver_iterate__ is iterate


def test_closing_a_solo_training_stops_it_at_the_epoch_it_reported(digits):
    gen = iterate(digits, model=MLP, epochs=50, batch_size=32, replicas=1, workers=1)
    assert [next(gen)["epoch"] for _ in range(2)] == [1, 2]
    gen.close()
    with pytest.raises(StopIteration):
        next(gen)


def test_bad_arguments_are_named_when_the_generator_starts(digits):
    with pytest.raises(TypeError):
        next(iterate(digits, model=MLP, epoch=3))
    with pytest.raises(ValueError, match="lr"):
        next(iterate(digits, model=MLP, lr=-1.0, workers=1))


def test_pick_workers_takes_its_own_worker_then_the_least_busy():
    alive = ["w1", "w2", "w3", "w4"]
    assert pick_workers(alive, {"w1": 3, "w2": 0, "w3": 1, "w4": 0}, "w3", 3) == ["w3", "w2", "w4"]
    assert pick_workers(alive, {"w1": 3}, None, 2) == ["w2", "w3"]  # outside a task
    assert pick_workers(alive, {}, "gone", 1) == ["w1"]  # a worker not in the cluster is skipped
    assert pick_workers(alive, {}, "w1", None) is None  # every worker


# ---- on a real cluster ---------------------------------------------------------------------------
def test_closing_a_gang_stops_every_member_at_the_next_epoch_boundary(client, digits):
    kw = dict(epochs=200, batch_size=32, replicas=1, workers=2)  # not submit's own workers=
    fut = client.submit(close_after, digits, 2, kw, pure=False)
    out = fut.result(timeout=WAIT)
    assert out["seen"] == [1, 2]
    ends: dict = {}
    deadline = time.monotonic() + WAIT  # the events ride the workers' batched streams: may lag
    while len(ends) < 2 and time.monotonic() < deadline:
        events = [msg for _, msg in client.get_events("quiver-training") if msg.get("task") == out["task"]]
        ends = {msg["rank"]: msg["epochs_done"] for msg in events if msg["kind"] == "end"}
        time.sleep(0.05)
    # both members ended (freed their workers) before close returned, at one and the same boundary
    assert sorted(ends) == [0, 1]
    assert ends[0] == ends[1] and 2 <= ends[0] < 200, ends
    # and the workers take new work
    assert client.submit(sum, [1, 2], pure=False).result(timeout=WAIT) == 3


def test_two_single_worker_trainings_run_side_by_side(client, digits, log_dir):
    from graph.tasks.iterative import Iterative
    from graph.parcels import opened

    kw = dict(epochs=2, batch_size=32, replicas=1, workers=1)
    a = client.submit(Iterative(drive), digits, "a", "b", log_dir, kw, pure=False)
    b = client.submit(Iterative(drive), digits, "b", "a", log_dir, kw, pure=False)
    # each waits after its first epoch for the other's: both finish only if they overlapped
    assert opened(a.result(timeout=2 * WAIT)) == {"me": "a"}  # a step's value travels as a parcel
    assert opened(b.result(timeout=2 * WAIT)) == {"me": "b"}
    assert sorted(os.listdir(log_dir)) == ["a", "b"]
