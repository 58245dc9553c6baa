"""A run as a pure state machine: events in, instructions out (docs/architecture.md §4).

* :mod:`graph.state.order`: the run's targets and their order (one function for the
  executor's priorities and the memory plan's model);
* :mod:`graph.state.events`: the events the driver feeds in and the instructions it gets back;
* :mod:`graph.state.machine`: :class:`ExplorationState`, every decision of a run, and the
  branch status rule.

Nothing here talks to a cluster; ``graph.executor`` is the thin driver that does.

>>> from graph.state import Start, TaskFinished, Submit
>>> TaskFinished("load-1")
TaskFinished(name='load-1')
"""

from __future__ import annotations

from .events import (
    Abort,
    Cancel,
    ChooseDecided,
    Fail,
    Finished,
    FirstResult,
    Gather,
    MemoryPlanned,
    MetricRead,
    Publish,
    Recompute,
    Release,
    Report,
    Start,
    Stop,
    Submit,
    TaskCancelled,
    TaskFailed,
    TaskFinished,
    Warn,
    WorkerLost,
)
from .machine import METRIC_ERROR_MODES, ExplorationState, branch_status
from .order import Target, priority, run_order, run_targets

__all__ = [
    "Abort",
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
    "Publish",
    "Recompute",
    "Release",
    "Report",
    "Start",
    "Stop",
    "Submit",
    "Target",
    "TaskCancelled",
    "TaskFailed",
    "TaskFinished",
    "Warn",
    "WorkerLost",
    "branch_status",
    "priority",
    "run_order",
    "run_targets",
]
