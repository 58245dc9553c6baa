"""Checks run before a cluster starts: the scheduler address, picklable steps (the run's options
are checked by their owner, ``graph.run.options``, before the compile).

A run refused here has started nothing and run nothing.

>>> check_run_options("localhost")
Traceback (most recent call last):
    ...
graph.errors.PipelineError: run: 'localhost' is not a scheduler address; ...
"""

from __future__ import annotations

import re
from typing import Any

from graph.errors import PipelineError

__all__ = ["check_run_options", "check_run", "ADDRESS"]

#: ``[protocol://]host:port`` (``tcp://10.0.0.1:8786``, ``ucxx://node7:8786``, ``[::1]:8786``,
#: ``[fe80::1%eth0]:8786``), or an in-process address (``inproc://host/pid/n``)
ADDRESS = re.compile(
    r"^(?:inproc://\S+|(?:[a-z][a-z0-9+.-]*://)?(?:\[[0-9a-fA-F:.]+(?:%[\w.-]+)?\]|[^\s:/\[\]]+):\d{1,5})$"
)


def check_run_options(client: Any) -> None:
    """Refuse a ``client`` string that is no scheduler address, naming the form one takes."""
    if isinstance(client, str) and not ADDRESS.match(client.strip()):
        raise PipelineError(
            f"run: {client!r} is not a scheduler address; give [protocol://]host:port, "
            "e.g. tcp://127.0.0.1:8786 (what `dask scheduler` prints)"
        )


def check_run(compiled: Any, client: Any) -> None:
    """All pre-flight checks: the scheduler address, then that every task can be pickled to the workers."""
    from graph.tasks.shipping import check_picklable

    check_run_options(client)
    check_picklable(compiled.graph)
    check_picklable(compiled.metric_graph, "choose metric: ")
