"""Checks run before a cluster starts: run options, scheduler address, picklable steps.

A run refused here has started nothing and run nothing.

>>> check_run_options(None, workers=0)
Traceback (most recent call last):
    ...
graph.errors.PipelineError: run: workers must be a whole number >= 1 (or None for one per core), got 0
>>> check_run_options("localhost")
Traceback (most recent call last):
    ...
graph.errors.PipelineError: run: 'localhost' is not a scheduler address; ...
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from graph.errors import PipelineError

__all__ = ["check_run_options", "check_run", "ADDRESS"]

#: ``[protocol://]host:port`` (``tcp://10.0.0.1:8786``, ``ucxx://node7:8786``, ``[::1]:8786``,
#: ``[fe80::1%eth0]:8786``), or an in-process address (``inproc://host/pid/n``)
ADDRESS = re.compile(
    r"^(?:inproc://\S+|(?:[a-z][a-z0-9+.-]*://)?(?:\[[0-9a-fA-F:.]+(?:%[\w.-]+)?\]|[^\s:/\[\]]+):\d{1,5})$"
)


def _whole(name: str, value: Any, optional: bool, hint: str = "") -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineError(f"run: {name} must be a whole number >= 1{hint}, got {value!r}")


def check_run_options(client: Any, *, workers: Any = None, threads_per_worker: Any = 1) -> None:
    """Refuse bad ``Node.run`` options with a message naming the option."""
    _whole("workers", workers, True, " (or None for one per core)")
    _whole("threads_per_worker", threads_per_worker, False)
    if isinstance(client, str) and not ADDRESS.match(client.strip()):
        raise PipelineError(
            f"run: {client!r} is not a scheduler address; give [protocol://]host:port, "
            "e.g. tcp://127.0.0.1:8786 (what `dask scheduler` prints)"
        )


def check_run(compiled: Any, client: Any, **options: Any) -> None:
    """All pre-flight checks: options, then that every task can be pickled to the workers."""
    from graph.tasks.shipping import check_picklable

    check_run_options(client, **options)
    check_picklable(compiled.graph)
    check_picklable(compiled.metric_graph, "choose metric: ")
