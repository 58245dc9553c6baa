"""A run's watchdog, the thin part that talks to the cluster: :class:`Sampler` samples the
scheduler (:func:`observe_scheduler`) and the run's progress and feeds the pure rule,
``graph.state.watchdog.Watchdog``, which decides whether the run is stuck and why.

>>> from graph.state.watchdog import stall_seconds
>>> stall_seconds(None)
60.0
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..state.watchdog import DEFAULT_STALL_TIMEOUT, Observation, Watchdog

__all__ = ["Sampler", "observe_scheduler"]

logger = logging.getLogger(__name__)


def observe_scheduler(dask_scheduler: Any) -> dict[str, Any]:
    """``client.run_on_scheduler(observe_scheduler)``: workers, paused ones, unrunnable tasks."""
    from distributed.core import Status

    workers = list(dask_scheduler.workers.values())
    paused = [ws for ws in workers if ws.status == Status.paused]
    fullest = max(paused, key=lambda ws: ws.memory.process, default=None)
    unrunnable = dask_scheduler.unrunnable
    return {
        "workers": len(workers),
        "paused": len(paused),
        "memory": None if fullest is None else (int(fullest.memory.process), int(fullest.memory_limit or 0)),
        "unrunnable": len(unrunnable),
        "example": next((str(ts.key) for ts in unrunnable), None),
        # compute time of every task that finished, cluster-wide: grows whenever a task finishes
        "finished": round(sum(tp.all_durations.get("compute", 0.0) for tp in dask_scheduler.task_prefixes.values()), 6),
    }


class Sampler:
    """Watch a real cluster for ``Watchdog`` and call ``on_abort(message)`` once if it says so.

    ``progress``: a callable returning a counter that grows as the run finishes tasks (the
    executor's count of finished results); without one, the scheduler's own count is used.
    ``reports``: a callable returning the run's count of reports taken (new iterations of
    its iterative steps; ``Observation.reports``); without one, reports are not watched.

    >>> with Sampler(client, stop_run, stall_timeout=60, progress=lambda: len(done)):   # doctest: +SKIP
    ...     run()
    """

    def __init__(
        self,
        client: Any,
        on_abort: Callable[[str], Any],
        stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        *,
        progress: Callable[[], int] | None = None,
        reports: Callable[[], int] | None = None,
        interval: float | None = None,
    ):
        address = getattr(getattr(client, "scheduler", None), "address", None)
        self.watchdog = Watchdog(stall_timeout, scheduler=f"the scheduler at {address}" if address else "the scheduler")
        self.client = client
        self.on_abort = on_abort
        self.progress = progress
        self.reports = reports
        self.interval = interval if interval is not None else min(1.0, stall_timeout / 10)
        self.verdict: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: Any = None
        self._pool: Any = None

    def _ask(self) -> dict | None:
        """One answer from the scheduler, or None when it has not answered within an interval
        (the question stays pending, so a slow scheduler is asked once at a time)."""
        import concurrent.futures

        if self._pending is None:
            self._pending = self._pool.submit(self.client.run_on_scheduler, observe_scheduler)
        try:
            answer = self._pending.result(timeout=max(self.interval, 0.5))
        except concurrent.futures.TimeoutError:
            return None
        except (OSError, concurrent.futures.CancelledError) as exc:  # recorded: the connection broke, no answer
            logger.debug("quiver watchdog: the scheduler did not answer: %s", exc)
            self._pending = None
            return None
        self._pending = None
        return answer

    def _loop(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # re-raised as the run's abort: a dead watchdog must not pass for a quiet run
            self.verdict = (
                f"the run's watchdog failed ({type(exc).__name__}: {exc}); the run is stopped rather than "
                "left unwatched. Report this as a Quiver bug (stall_timeout=0 runs without the watchdog)."
            )
            self.on_abort(self.verdict)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            info = self._ask()
            if self._stop.is_set():
                return
            t = time.monotonic()
            if info is None:
                obs = Observation(t=t, answered=False)
            else:
                progress = self.progress() if self.progress is not None else info["finished"]
                obs = Observation(
                    t=t, workers=info["workers"], paused=info["paused"], progress=progress,
                    unrunnable=info["unrunnable"], memory=info["memory"], example=info["example"],
                    reports=self.reports() if self.reports is not None else 0,
                )
            verdict = self.watchdog.observe(obs)
            if verdict is not None:
                self.verdict = verdict
                self.on_abort(verdict)
                return

    def start(self) -> "Sampler":
        import concurrent.futures

        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quiver-watchdog-ask")
        self._thread = threading.Thread(target=self._loop, name="quiver-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
