"""Whether this code runs inside a Dask task: the one answer Quiver uses everywhere.

``distributed.get_worker()`` raises ``ValueError("No worker found")`` outside a task; that,
and only that, means "not in a task" here. Any other error is a real one and propagates.

>>> current_worker() is None, current_task() is None, task_cancelled()   # not in a task here
(True, True, False)
"""

from __future__ import annotations

from typing import Any

__all__ = ["current_task", "current_worker", "task_cancelled"]


def current_worker() -> Any:
    """The ``distributed.Worker`` running the current task, or ``None`` outside a task."""
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
