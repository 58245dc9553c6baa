"""What goes into the exploration state machine (events) and what comes out (instructions).

Events are facts the driver observed (a task finished, a metric was read, a result was
lost with its worker, someone asked to abort); instructions are what the machine decided
the driver must do (submit these tasks, read these metrics, release or cancel these
results, wait for these again, show this, stop).  Every one is produced and acted on in
production (``graph.run.executor``). Both are small frozen values, so a test writes them literally::

    >>> TaskFinished("load-1"), Release(("load-1",))
    (TaskFinished(name='load-1'), Release(names=('load-1',)))

The contract is listed in docs/architecture.md §4.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    # events
    "Abort",
    "MemoryPlanned",
    "MetricRead",
    "MetricSent",
    "Report",
    "Start",
    "TaskCancelled",
    "TaskFailed",
    "TaskFinished",
    "TaskLost",
    # instructions
    "Answer",
    "Cancel",
    "ChooseDecided",
    "Fail",
    "Finished",
    "FirstResult",
    "Gather",
    "Release",
    "Replan",
    "Submit",
    "Warn",
    "Watch",
]


# ---- events (driver -> machine) ---------------------------------------------------------------
@dataclass(frozen=True)
class Start:
    """Open every target not behind a choose (``first_only``: only the first one, a sampling
    pass; a later ``Start()`` opens the rest)."""

    first_only: bool = False


@dataclass(frozen=True)
class TaskFinished:
    """The task submitted under ``name`` (a key, or its recompute copy) is in memory."""

    name: str


@dataclass(frozen=True)
class TaskFailed:
    """The task submitted under ``name`` raised."""

    name: str
    error: str  # "Type: message"
    traceback: str = ""


@dataclass(frozen=True)
class TaskCancelled:
    """Dask itself cancelled ``name`` (the machine never gets this for what it cancelled)."""

    name: str


@dataclass(frozen=True)
class MetricRead:
    """The value of the finished metric task ``name`` (answer to a :class:`Gather`)."""

    name: str
    metric: float
    scalars: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricSent:
    """The step running under ``step`` sent the metric ``name`` while it ran (a read fused into
    the step's task: ``graph.tasks.fusedmetric``), before or after its :class:`TaskFinished` comes.
    ``error`` (``"Type: message"``) when the step's value gave no metric; ``metric`` is then
    ``None``. The first one for ``name`` counts: a step computed again sends it again."""

    name: str
    step: str
    metric: float | None
    scalars: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    traceback: str = ""


@dataclass(frozen=True)
class TaskLost:
    """The result submitted under ``name`` was lost with its worker before the driver took its
    outcome (the future's status was ``lost`` or ``pending`` again when its done-callback
    fired): Dask computes it again, since the run holds it; the machine asks to :class:`Watch` it."""

    name: str


@dataclass(frozen=True)
class MemoryPlanned:
    """The memory plan (re)decided which finished results may be released early and recomputed;
    ``copyable``: when the run's data do not fit its budget, the keys a partition read again after
    a reduction may be computed again for that read instead of held (graph/state/secondpass.py)."""

    droppable: frozenset
    copyable: frozenset = frozenset()


@dataclass(frozen=True)
class Abort:
    """Stop the run now with ``reason`` (a watchdog, a result too big for the budget, Ctrl-C).
    ``blame``: the task whose step caused it (a step too large for its worker), whose branches
    are ``failed`` with ``reason``; the others are ``cancelled``."""

    reason: str
    blame: Any = None


@dataclass(frozen=True)
class Report:
    """An iterative step (``name``) reported ``values`` at ``iteration``."""

    name: str
    iteration: int
    values: Mapping[str, Any]


# ---- instructions (machine -> driver) ------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Submit ``tasks`` (name -> ``dask.task_spec.Task``) with Dask ``priority`` (name -> int);
    ``internal``: names whose results only other submitted tasks read (a second pass's copies):
    the run holds no future for them, so Dask lets each go as soon as its readers are done."""

    tasks: Mapping[str, Any]
    priority: Mapping[str, int]
    internal: frozenset = frozenset()


@dataclass(frozen=True)
class Gather:
    """Read the values of these finished metric tasks and answer with :class:`MetricRead`."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    """Let go of these finished (or failed) results."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """Answer the iterative step running under ``name``, waiting at the rung it reached with
    ``iteration`` reports: ``"continue"`` or ``"stop"`` (``graph.tasks.iterative.ReportChannel``)."""

    name: str
    iteration: int
    answer: str


@dataclass(frozen=True)
class Cancel:
    """Cancel these unfinished tasks."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class ChooseDecided:
    """A choose decided one group: input indices kept (best first), dropped, cancelled."""

    choose: int
    group: Any
    keep: tuple[int, ...]
    drop: tuple[int, ...]
    cancel: tuple[int, ...]


@dataclass(frozen=True)
class FirstResult:
    """The first branch result (a metric or an output value) is in."""


@dataclass(frozen=True)
class Watch:
    """Wait again for these held results (Dask computes them again after a :class:`TaskLost`):
    the driver registers a new done-callback on each."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Warn:
    """Show ``message`` to the user now (the progress line)."""

    message: str


@dataclass(frozen=True)
class Fail:
    """Stop the run: raise ``RunError(message)``."""

    message: str


@dataclass(frozen=True)
class Finished:
    """Every target is resolved or dead: the run is over."""


@dataclass(frozen=True)
class Replan:
    """Re-plan the run's memory now (a run under a budget: ``ExplorationState.planning``).
    ``why``: ``"first-result"`` (the first branch result is in) or ``"decision"`` (a choose
    decided: at most one per handling, after its other instructions; the machine paces it)."""

    why: str
