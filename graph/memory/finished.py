"""What a budgeted worker forgets of a task once it has run: its run_spec.

Dask's worker keeps every task's ``TaskState`` until the scheduler lets it forget it, and a task
whose result is gone stays in its worker's state (``released``) as long as a task that read it is
still known there (``distributed`` keeps the links on purpose). A partial sum of a tree reduction
held until its reduction's last level runs therefore keeps the whole lineage below it, every
partition's read, cleaning and feature task, for the length of the reduction: on
``examples/big_table_explore.py`` all of a pass's tasks stayed known until its end (2,000 per
worker after 3 minutes at 3x one worker, 7,400 after 22 minutes at 20x, growing through the pass).

Each of them kept its ``run_spec``, unpickled per task: the Dask DataFrame task specs carry their
own copies of what pickling shared (``meta`` frames, the Parquet dataset's description). Measured
with ``tracemalloc`` on that run's workers, dropping the specs of finished tasks freed 15 MiB of
Python memory at 64 tasks; the retained specs grew a worker's unmanaged memory by ~10 KiB per task
over the run, memory no plan sees, and at 20x one worker it reached the pause line.

A finished task's spec is never read again by its worker: a task in memory answers a repeated
``compute-task`` with its result, and a released one that must run again gets the spec anew in the
scheduler's ``compute-task`` (``distributed.worker_state_machine``: ``ts.run_spec = ev.run_spec``).
A task that is cancelled while it runs (``cancelled``/``resumed``) keeps its spec.

>>> class TS:
...     run_spec = "spec"
>>> tasks = {"a": TS()}
>>> drop_finished_spec(tasks, "a", "executing", "memory")
True
>>> tasks["a"].run_spec is None
True
>>> drop_finished_spec(tasks, "a", "waiting", "ready")
False
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RAN", "drop_finished_spec"]

#: the states a task leaves when its function has returned and its result is in memory
RAN = frozenset({"executing", "long-running", "resumed"})


def drop_finished_spec(tasks: Mapping[Any, Any], key: Any, start: str, finish: str) -> bool:
    """Forget the run_spec of ``key`` in ``tasks`` (a worker's ``state.tasks``) when the
    transition ``start -> finish`` is the end of its run with a result in memory; whether it did."""
    if finish != "memory" or start not in RAN:
        return False
    ts = tasks.get(key)
    if ts is None or getattr(ts, "run_spec", None) is None:
        return False
    from .._dask import forget_run_spec

    forget_run_spec(ts)
    return True
