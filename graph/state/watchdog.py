"""A run's watchdog: it ends a run that has stopped making progress, with a one-line cause and fix.

Dask waits as long as it takes: workers paused by memory wait for memory that never frees,
tasks pinned to workers that are gone wait for them to come back, a client waits for a
scheduler that stopped answering.  A Quiver run instead ends in bounded time.

Two parts, as everywhere in Quiver:

* :class:`Watchdog` decides, from observations over time, whether the run is stuck and why.
  It is pure (no cluster, no clock of its own) and tested with literal observations.
* ``graph.run.watchdog.Sampler`` is the thin part: a thread that samples the scheduler (workers, their
  status and memory, tasks no worker can run) and the run's progress once a second, feeds
  the :class:`Watchdog`, and calls ``on_abort(message)`` once when it says so.

>>> w = Watchdog(stall_timeout=30)
>>> w.observe(Observation(t=0, workers=2, paused=2, progress=4))
>>> w.observe(Observation(t=20, workers=2, paused=2, progress=4)) is None
True
>>> print(w.observe(Observation(t=31, workers=2, paused=2, progress=4, memory=(250 * 2**20, 300 * 2**20))))
2 of 2 workers paused by memory (the fullest at 250.00 MiB of its 300.00 MiB limit) and no task finished or reported for 31 s: ...
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_STALL_TIMEOUT", "Observation", "Watchdog", "stall_seconds"]

#: seconds without progress (with workers paused, none connected, tasks no worker can run,
#: or the scheduler silent) after which a run is stopped
DEFAULT_STALL_TIMEOUT = 60.0


def stall_seconds(stall_timeout: float | None) -> float | None:
    """The one meaning of a run's ``stall_timeout``: ``None`` is the default
    (:data:`DEFAULT_STALL_TIMEOUT`), ``0`` turns the watchdog off (returns ``None``), a positive
    number is the seconds; anything else is refused with a ``ValueError``.

    >>> stall_seconds(None), stall_seconds(0), stall_seconds(5)
    (60.0, None, 5.0)
    """
    if stall_timeout is None:
        return DEFAULT_STALL_TIMEOUT
    if isinstance(stall_timeout, bool) or not isinstance(stall_timeout, (int, float)) or not stall_timeout >= 0:
        raise ValueError(
            f"stall_timeout must be seconds (a number >= 0; 0 turns the watchdog off, None is "
            f"{DEFAULT_STALL_TIMEOUT:g} s), not {stall_timeout!r}"
        )
    return float(stall_timeout) if stall_timeout > 0 else None


def _fmt(n: float) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))


@dataclass(frozen=True)
class Observation:
    """One look at the run at time ``t`` (seconds, any origin).

    ``answered``: the scheduler answered this sample (when False the other fields are
    ignored).  ``workers``: workers connected; ``paused``: how many of them Dask paused
    for memory; ``progress``: a number that grows whenever the run finishes a task;
    ``unrunnable``: tasks that no connected worker may run (e.g. a gang's members pinned
    to workers that are gone); ``memory``: (process bytes, memory limit) of the fullest
    paused worker, for the message; ``example``: one unrunnable task's key.
    """

    t: float
    workers: int = 1
    paused: int = 0
    progress: float = 0
    unrunnable: int = 0
    answered: bool = True
    memory: tuple[int, int] | None = None
    example: str | None = None
    reports: float = 0


class Watchdog:
    """Decide whether a run is stuck.  ``observe`` returns ``None``, or the message to stop with.

    Each condition must hold, with no progress, for ``stall_timeout`` seconds:

    * the scheduler does not answer;
    * no worker is connected (they died, or never started);
    * some workers are paused by memory and nothing finishes;
    * tasks wait that no connected worker may run, and nothing finishes.

    A run that is merely slow (a long step computing on a running worker) is never stopped.

    **Progress** is a finished task *or a new report* of an iterative step.  A step that
    reports is computing: a long first epoch on a worker Dask paused by memory (pausing stops
    new tasks, not the running one), or branches training while a gang waits for workers
    that are gone, keep the run going, and each of those conditions counts from the last
    report as from the last finished task; once the reporting steps end, the conditions that
    still hold stop the run ``stall_timeout`` later.  Reports reset the paused, unrunnable
    and no-worker conditions alike (one notion of progress; a report in flight from a worker
    that just left is harmless: the no-worker clock restarts once).  They do **not** reset
    the silent scheduler: reports travel one way on the workers' batched streams, which keep
    flowing from a scheduler that cannot answer a request, while the run needs answered
    requests (submissions, gathers, and the rung answers that iterative steps wait for).
    Replays of a restarted step are not new reports (the run counts each iteration once),
    so a step that keeps restarting does not pass for progress.

    >>> w = Watchdog(stall_timeout=10)
    >>> [w.observe(Observation(t=t, paused=1, progress=0, reports=t // 5)) for t in (0, 9, 18)]
    [None, None, None]
    >>> w.observe(Observation(t=30, paused=1, progress=0, reports=3)) is None   # 12 s since the last report
    False
    """

    def __init__(self, stall_timeout: float = DEFAULT_STALL_TIMEOUT, scheduler: str = "the scheduler"):
        if not (isinstance(stall_timeout, (int, float)) and stall_timeout > 0):
            raise ValueError(f"stall_timeout must be a positive number of seconds, got {stall_timeout!r}")
        self.timeout = float(stall_timeout)
        self.scheduler = scheduler
        self.last_answer: float | None = None
        self.last_progress: tuple[float, tuple] | None = None  # (since, (progress, reports))
        self.since: dict[str, float] = {}  # condition -> first time it was seen (continuously)

    def _hold(self, name: str, now: bool, t: float) -> float:
        """How long condition ``name`` has held continuously (0 when it does not hold now)."""
        if not now:
            self.since.pop(name, None)
            return 0.0
        return t - self.since.setdefault(name, t)

    def observe(self, o: Observation) -> str | None:
        if self.last_answer is None:
            self.last_answer = o.t
        if not o.answered:
            silent = o.t - self.last_answer
            if silent >= self.timeout:
                return (
                    f"{self.scheduler} has not answered for {silent:.0f} s: it is overloaded, stuck or gone. "
                    "Check that it is running (its log, its dashboard); restart it and run again "
                    "(stall_timeout / --stall-timeout sets how long to wait)."
                )
            return None
        self.last_answer = o.t
        mark = (o.progress, o.reports)  # a finished task or a new report (see the class docs)
        if self.last_progress is None or mark != self.last_progress[1]:
            self.last_progress = (o.t, mark)
            self.since.clear()  # each condition counts from here, if it still holds
        idle = o.t - self.last_progress[0]
        none, paused, unrunnable = (
            self._hold("no workers", o.workers == 0, o.t),
            self._hold("paused", o.paused > 0, o.t),
            self._hold("unrunnable", o.unrunnable > 0, o.t),
        )
        if idle < self.timeout:
            return None
        if none >= self.timeout:
            return (
                f"no worker has been connected to {self.scheduler} for {idle:.0f} s: the workers died or "
                "could not start. Read the workers' log for why; start workers "
                "(`dask worker SCHEDULER_ADDRESS`) or run without a scheduler address to use an embedded cluster."
            )
        if paused >= self.timeout:
            fullest = ""
            if o.memory is not None:
                fullest = f" (the fullest at {_fmt(o.memory[0])} of its {_fmt(o.memory[1])} limit)"
            return (
                f"{o.paused} of {o.workers} workers paused by memory{fullest} and no task finished or reported for "
                f"{idle:.0f} s: what the workers hold (results, the libraries the steps load, and the "
                "steps' temporaries) does not fit their memory limit. Raise the memory budget "
                "(--memory-budget) or memory limit, use fewer workers, or make the steps produce smaller results."
            )
        if unrunnable >= self.timeout:
            example = f" (e.g. {o.example!r})" if o.example else ""
            return (
                f"{o.unrunnable} task(s){example} have waited {idle:.0f} s for workers that are not "
                f"connected (a training gang or a task pinned to workers that are gone, or that need "
                f"resources no worker has), and no task finished or reported meanwhile. Start the missing workers, "
                "or run on a cluster whose workers can run them."
            )
        return None
