"""A run as a pure state machine: events in, instructions out (docs/architecture.md §4).

* :mod:`graph.state.order`: the run's targets and their order (one function for the
  executor's priorities and the memory plan's model);
* :mod:`graph.state.events`: the events the driver feeds in and the instructions it gets back;
* :mod:`graph.state.machine`: :class:`ExplorationState`, every decision of a run;
* :mod:`graph.state.status`: branch statuses, their rule and their colours;
* :mod:`graph.state.rows`: a branch's final state (a row of the table);
* :mod:`graph.state.ranking`: best first, a choose's decision, the threshold;
* :mod:`graph.state.halving`: a pruning choose's rule (asynchronous successive halving);
* :mod:`graph.state.claims`: which packed task trains which member;
* :mod:`graph.state.watchdog`: whether a run is stuck, and the meaning of ``stall_timeout``.

Nothing here talks to a cluster (``tests/test_layout.py`` checks it); ``graph.run.executor`` is
the thin driver that does, with ``graph.compiling.packing`` (the claim table on the scheduler) and
``graph.run.watchdog`` (the thread that samples the scheduler). Names load
on first use, so ``graph.memory.plan`` (imported on workers) reads the order without loading
the machine.

>>> from graph.state import Start, TaskFinished, Submit
>>> TaskFinished("load-1")
TaskFinished(name='load-1')
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Abort",
    "Answer",
    "Cancel",
    "ChooseDecided",
    "ExplorationState",
    "Fail",
    "Finished",
    "FirstResult",
    "Gather",
    "METRIC_ERROR_MODES",
    "MemoryPlanned",
    "MetricRead",
    "MetricSent",
    "Release",
    "Replan",
    "Report",
    "Start",
    "Submit",
    "Target",
    "TaskCancelled",
    "TaskFailed",
    "TaskFinished",
    "TaskLost",
    "Warn",
    "Watch",
    "branch_status",
    "priority",
    "run_order",
    "run_targets",
]

_EVENTS = {n for n in __all__ if n[0].isupper() and n not in ("ExplorationState", "METRIC_ERROR_MODES", "Target")}
_LAZY = {n: "graph.state.events" for n in _EVENTS}
_LAZY.update({n: "graph.state.machine" for n in ("ExplorationState", "METRIC_ERROR_MODES")})
_LAZY["branch_status"] = "graph.state.status"
_LAZY.update({n: "graph.state.order" for n in ("Target", "priority", "run_order", "run_targets")})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graph.state' has no attribute {name!r}")
