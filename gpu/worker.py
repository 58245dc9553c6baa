"""Whether this code runs inside a Dask task: the one answer Quiver uses everywhere.

``distributed.get_worker()`` raises ``ValueError("No worker found")`` outside a task; that,
and only that, means "not in a task" here. Any other error is a real one and propagates.

>>> current_worker() is None, current_task() is None, task_cancelled()   # not in a task here
(True, True, False)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["current_task", "current_worker", "task_cancelled", "task_client"]


def current_worker() -> Any:
    """The ``distributed.Worker`` running the current task, or ``None`` outside a task (and
    without importing Dask where nothing has: no task runs in such a process)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:  # get_worker() outside a task: "No worker found"
        return None


def current_task() -> str | None:
    """The key of the task this thread runs (as ``str``), or ``None`` outside a task."""
    if current_worker() is None:
        return None
    from distributed.worker import thread_state

    key = getattr(thread_state, "key", None)
    return None if key is None else str(key)


#: the states a worker gives an executing task the run no longer wants (its future released,
#: its client gone): Dask lets the task run on, so a long task asks between its steps
_UNWANTED = ("cancelled", "released", "forgotten")


def task_cancelled(worker: Any = None, key: str | None = None) -> bool:
    """Whether the run no longer wants task ``key`` on ``worker`` (default: the task this thread
    runs); ``False`` outside a task. The one rule iterative steps and gangs stop by."""
    if worker is None:
        worker, key = current_worker(), current_task()
    if worker is None or key is None:
        return False
    ts = worker.state.tasks.get(key)
    return ts is None or ts.state in _UNWANTED


#: how often :func:`task_client` asks again while Dask cannot hand out the worker's client
CLIENT_RETRY_S = 0.5
#: how long a task asks for the worker's client before the run is told (an infrastructure error)
CLIENT_WAIT_S = 120.0


def task_client(stop: Callable[[], bool] = task_cancelled, retry: float = CLIENT_RETRY_S) -> Any:
    """The worker's client, for the task this thread runs, or ``None`` once ``stop()`` says the
    run no longer wants the task.

    ``distributed.get_client()`` in a task makes the worker's client on first use, and Dask's
    client start asserts things a fault can make false: while the scheduler handles a lost or
    stopped worker, its reply to the new client can hold more than the one message
    ``Client._ensure_connected`` asserts (seen in ``benchmarks/chaos.py``; Dask's
    ``Worker._get_client`` also asserts the new client is running). The bare
    ``AssertionError`` would fail a training branch that nothing was wrong with. This asks again
    every ``retry`` s while the worker runs; a worker that is closing reschedules the task
    (``distributed.Reschedule``: Dask runs it elsewhere, as after a worker's death).
    """
    from distributed import Reschedule, get_client
    from distributed.core import Status

    deadline = time.monotonic() + CLIENT_WAIT_S
    while True:
        try:
            return get_client()
        except Exception as exc:  # retried or rescheduled below: Dask's own error, not the step's
            worker = current_worker()
            if worker is None:  # not in a task: Dask's answer as it is
                raise
            if worker.status not in (Status.running, Status.paused):
                raise Reschedule() from exc
            if stop():
                return None
            if time.monotonic() > deadline:  # not asked for ever: Dask's error, named as the machinery's
                raise RuntimeError(f"the worker's Dask client did not start within {CLIENT_WAIT_S:.0f} s "
                                   f"(last: {type(exc).__name__}: {exc}); an infrastructure error, not the step's") from exc
            logger.info("quiver: the worker's client is not ready (%s: %s); asking again in %g s",
                        type(exc).__name__, exc, retry)
            time.sleep(retry)
