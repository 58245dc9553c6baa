""""Am I in a Dask task?": one answer (gpu.worker), used by every module that asks."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _answers():
    from gpu import gang, training
    from gpu.worker import current_task, current_worker
    from graph.tasks.iterative import _Task

    w = current_worker()
    t = _Task()
    return {
        "worker": None if w is None else w.address,
        "task": current_task(),
        "training._current_task": training._current_task(),
        "training._worker_address": training._worker_address(),
        "gang._inside_task": gang._inside_task(),
        "iterative._Task": (None if t.worker is None else t.worker.address, t.key),
    }


def test_every_module_gives_the_same_answer_inside_and_outside_a_task(client):
    outside = _answers()
    assert outside == {"worker": None, "task": None, "training._current_task": None, "training._worker_address": None,
                       "gang._inside_task": False, "iterative._Task": (None, None)}
    fut = client.submit(_answers, key="quiver-in-task-probe", pure=False)
    inside = fut.result()
    assert inside["worker"] in client.scheduler_info()["workers"]
    assert inside["task"] == inside["training._current_task"] == "quiver-in-task-probe"
    assert inside["training._worker_address"] == inside["worker"] and inside["gang._inside_task"] is True
    assert inside["iterative._Task"] == (inside["worker"], "quiver-in-task-probe")


def test_only_gpu_worker_calls_get_worker():
    """The rule has one owner: no other module asks ``distributed.get_worker()`` (and turns its
    errors into an answer of its own)."""
    calls = []
    for package in ("pipelines", "graph", "gpu"):
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() == "gpu/worker.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bget_worker\(\)", line) and "``" not in line:
                    calls.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert calls == []


@contextlib.contextmanager
def _get_client_failing(failures: int):
    """For the block: ``distributed.get_client`` fails ``failures`` times the way a worker's new
    client did in a chaos run after a fault (Dask's ``assert len(msg) == 1`` in
    ``Client._ensure_connected``: a bare ``AssertionError``), then works. Yields the list of
    calls made so far."""
    import distributed

    real, calls = distributed.get_client, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) <= failures:
            raise AssertionError()
        return real(*a, **k)

    distributed.get_client = flaky
    try:
        yield calls
    finally:
        distributed.get_client = real


def _client_after_failures(failures: int, stop_after: int | None = None):
    """In a task, with ``get_client`` failing: ``task_client`` waits it out (or stops when told to)."""
    from gpu import worker as gw

    with _get_client_failing(failures) as calls:
        stop = (lambda: len(calls) >= stop_after) if stop_after else (lambda: False)
        got = gw.task_client(stop, retry=0.01)
    return {"calls": len(calls), "scheduler": None if got is None else got.scheduler.address}


def _train_sees_a_client_after_failures(failures: int) -> dict:
    """In a task: ``gpu.train``'s "is there a client for a gang?" while ``get_client`` fails;
    it must wait, not fail the branch."""
    from gpu import training

    with _get_client_failing(failures) as calls:
        return {"available": training._client_available(), "calls": len(calls)}


def test_a_tasks_client_is_waited_for_while_a_fault_leaves_it_connecting(client):
    got = client.submit(_client_after_failures, 3, key="quiver-client-probe", pure=False).result()
    assert got == {"calls": 4, "scheduler": client.scheduler.address}  # three failures, then the client
    stopped = client.submit(_client_after_failures, 10**6, 2, key="quiver-client-stop", pure=False).result()
    assert stopped == {"calls": 2, "scheduler": None}  # the run let the task go: no client, no error


def test_train_asks_for_its_client_the_one_way(client):
    got = client.submit(_train_sees_a_client_after_failures, 2, key="quiver-train-client", pure=False).result()
    assert got == {"available": True, "calls": 3}  # a bare AssertionError before would fail the branch


def test_outside_a_task_dasks_own_error_is_not_waited_out(monkeypatch):
    import distributed

    from gpu.worker import task_client

    def none(*a, **k):
        raise ValueError("No global client found and no address provided")

    monkeypatch.setattr(distributed, "get_client", none)  # Dask's answer outside a task with no client
    with pytest.raises(ValueError, match="No global client found"):  # at once, not after retries
        task_client(lambda: False, retry=60)


def test_a_rung_wait_asks_again_after_a_broken_link_but_not_after_no_answer():
    from distributed.comm.core import CommClosedError

    from graph.tasks.iterative import _asked

    def broken(timeout):
        raise CommClosedError("in <TCP (closed) ConnectionPool.event_wait>: Stream is closed")

    def silent(timeout):
        raise TimeoutError()

    assert _asked(broken, 0.01, "again") == "again"  # the link broke: the wait goes on
    assert _asked(lambda timeout: "stop", 0.01, "again") == "stop"
    with pytest.raises(TimeoutError):  # no answer yet is the caller's (also an OSError in Python)
        _asked(silent, 0.01, "again")
