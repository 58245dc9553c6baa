"""The user's process computes while a new embedded cluster's workers start: the bridge.

On two cores a new embedded cluster's scheduler is up ~0.4 s after the call, but its workers
come ~1.5 s after it (the fork server imports ``distributed`` and the steps' libraries on one
core, :mod:`graph.cluster.workerstart`), while the other core waits.  The user's process has the
steps' libraries imported already: it built the steps.  So for a run of plain steps Quiver
adds one in-process worker thread, *the bridge*, to a new embedded cluster as soon as its
scheduler is up, starts the run on it, and retires it once the cluster's own workers have
registered:

1. the bridge's status goes to Dask's ``closing_gracefully`` (the scheduler gives it no more
   tasks; those queued on it, not started, go to the workers);
2. the task it is running finishes and the scheduler hears of its result;
3. Dask's ``Scheduler.retire_workers`` copies what only the bridge holds to a worker;
4. the bridge serves the requests for its data until none has come for a moment, then answers
   them ``busy`` (Dask's reply when a worker has too many transfers: the asker takes another
   holder) until none has come again, and only then leaves the scheduler and, shortly after,
   closes: no fetch from it is cut off.

No task runs twice (a started task is never handed elsewhere), and a kept cluster
(:mod:`graph.cluster.embedded`) never has the bridge: reusing or closing one first waits for its
retirement (:func:`settle`).

What a task run on the bridge sees is the user's process: its allocator and thread settings,
not the workers' (:mod:`graph.cluster.workerenv`), and a step that crashes the interpreter takes the
user's process with it.  So only runs of plain steps get a bridge (:func:`eligible`: no
iterative or training steps, no Dask collections; and, decided by ``graph.cluster.connect.connect``,
no memory budget), and dask config
``quiver.embedded-cluster.bridge: false`` turns it off.

>>> from dask.task_spec import Task
>>> eligible({"a": Task("a", len, [1])}, collections=False, modules=["sklearn.svm._classes"])
True
>>> eligible({"a": Task("a", len, [1])}, collections=False, modules=["torch.nn.modules.linear"])
False
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._dask import (
    executing_keys,
    move_queued_task,
    refuse_transfers,
    stop_new_tasks,
    transfers_out,
    worker_with_hooks,
)
from ..config import config_flag

__all__ = ["Bridge", "eligible", "enabled", "settle"]

logger = logging.getLogger(__name__)

_CONFIG = "quiver.embedded-cluster.bridge"
NAME = "quiver-bridge"
#: seconds without a request for its data that end each phase of the retiring bridge's drain
#: (:meth:`BridgeWorker.drain`), and at most this long waiting for such a pause, per phase
DRAIN_QUIET, DRAIN_LIMIT = 0.1, 1.0
#: seconds the bridge still serves its data after it has left the scheduler, before it closes
CLOSE_GRACE = 0.5
#: libraries whose steps keep state per process or hold the GIL for long (training): never bridged
_NOT_BRIDGED = ("torch", "gpu", "tensorflow", "jax", "cupy")


def enabled() -> bool:
    """dask config ``quiver.embedded-cluster.bridge`` (default ``True``)."""
    return config_flag(_CONFIG, "the user's process computes while a new embedded cluster's workers start")


def eligible(graph: Mapping[str, Any], collections: bool, modules: Iterable[str]) -> bool:
    """Whether a run of the compiled ``graph`` may start on the bridge: only plain steps (no
    iterative step, which reports and waits at rungs from its worker), no Dask collections
    (partitions may be large: they would land in the user's process) and no training
    libraries among the steps' ``modules``."""
    from ..state.machine import runs_iterative  # the one rule for "an iterative step's task"

    if collections:
        return False
    if any(str(m).split(".")[0] in _NOT_BRIDGED for m in modules):
        return False
    return not any(runs_iterative(task) for task in graph.values())


class Bridge:
    """One new embedded cluster's bridge: the cluster's start runs in a thread of its own
    (:meth:`begin`), the caller gets the cluster as soon as its scheduler is up, adds the
    bridge worker (:meth:`attach`), and the thread retires it once the workers are in."""

    def __init__(self, timeout: float = 120.0):
        self.timeout = timeout
        self.cluster: Any = None
        self.worker: Any = None
        self.error: BaseException | None = None
        self._handed = threading.Event()
        self._attached = threading.Event()
        self._gone = threading.Event()  # the scheduler has no bridge any more (or never will have)
        self._closing = threading.Event()  # the cluster is closing: the retirement need not linger
        self._thread: threading.Thread | None = None

    # -- the start, in its own thread ------------------------------------------------------
    def begin(self, start: Callable[[Callable[[Any], None]], Any]) -> Any:
        """Run ``start(hand)`` in a thread; ``start`` calls ``hand(cluster)`` once the
        cluster's scheduler is up and then waits for its workers.  Returns that cluster (or
        raises ``start``'s error when it failed before handing one)."""
        def run() -> None:
            try:
                start(self._hand)
            except BaseException as exc:  # kept: the caller raises it, or the run goes on without workers
                self.error = exc
                logger.warning("quiver: the embedded cluster's workers did not start (%s: %s)", type(exc).__name__, exc)
                self._handed.set()
                self._gone.set()
                return
            try:
                self._retire()
            finally:
                self._gone.set()

        self._thread = threading.Thread(target=run, name="quiver-cluster-start", daemon=True)
        self._thread.start()
        self._handed.wait()
        if self.cluster is None:
            assert self.error is not None
            raise self.error
        self.cluster._quiver_bridge = self
        return self.cluster

    def _hand(self, cluster: Any) -> None:
        self.cluster = cluster
        self._handed.set()

    def attach(self) -> None:
        """Add the bridge worker (in this process, on the cluster's event loop)."""
        try:
            self.worker = self.cluster.sync(self._start_worker)
        except Exception as exc:  # logged: the run waits for the cluster's own workers instead
            logger.warning("quiver: no bridge worker (%s: %s)", type(exc).__name__, exc)
        finally:
            self._attached.set()

    async def _start_worker(self) -> Any:
        return await _worker_class()(self.cluster.scheduler_address, nthreads=1, name=NAME, memory_limit=0,
                                     dashboard=False)

    # -- the retirement, in the start's thread -----------------------------------------------
    def _retire(self) -> None:
        self._attached.wait(self.timeout)
        if self.worker is None:
            return
        try:
            self.cluster.sync(self._retire_async)
        except Exception as exc:  # logged: the worker is closed below, Dask recomputes what it held
            logger.warning("quiver: retiring the bridge worker failed (%s: %s)", type(exc).__name__, exc)
            try:
                self.cluster.sync(self.worker.close)
            except Exception as again:  # logged: already closed, or the cluster is going away
                logger.debug("quiver: closing the bridge worker: %s", again)

    async def _retire_async(self) -> None:
        from distributed.core import Status

        from .heartbeats import stop as stop_heartbeats

        worker, scheduler = self.worker, self.cluster.scheduler
        if worker.status != Status.running:  # closed with the cluster, or paused: Dask's business
            return
        # no more tasks for it, and those queued on it and not started go to the workers now (not
        # when it leaves: a long task it is running would hold them back)
        stop_new_tasks(worker)
        _hand_over_queued(scheduler, worker)
        deadline = time.monotonic() + self.timeout
        while executing_keys(worker) and time.monotonic() < deadline:  # its running task ends here
            await asyncio.sleep(0.005)
        # ... and the scheduler knows its results are here before Dask moves what only the bridge holds
        while time.monotonic() < deadline and not _all_known(scheduler, worker):
            await asyncio.sleep(0.005)
        # no heartbeat from here on: one in flight while the scheduler removes it, or while it
        # closes, logs an error (Dask's "Unexpected exception during heartbeat") in the user's output
        await stop_heartbeats(worker, timeout=max(0.0, deadline - time.monotonic()))
        # what Worker.close_gracefully does (Dask copies what only the bridge holds to a worker), in
        # three steps, so that no worker or client is fetching from it when it goes: each one that
        # was, when Dask removed it at once, logged "Worker stream died during communication" with
        # a traceback into the user's output (5 of 30 digits first calls), and a fetch that found
        # its port closed is retried by Dask for its 30 s connect timeout
        stimulus = f"quiver-bridge-retire-{time.time()}"
        await scheduler.retire_workers(workers=[worker.address], close_workers=False, remove=False,
                                       stimulus_id=stimulus)
        # the scheduler's "closing_gracefully" (sent by retire_workers on the worker's stream) must
        # reach the worker before it starts closing: arriving after, Dask logs "Invalid
        # Worker.status transition: Status.closing -> Status.closing_gracefully" as an ERROR into
        # the user's output (issue 44: 2 of 7 README runs, when the script ended at once)
        try:
            await asyncio.wait_for(worker.told_retiring().wait(), timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except asyncio.TimeoutError:  # logged: the worker closes all the same
            logger.debug("quiver: the bridge closes before the scheduler's word of its retirement came")
        await worker.drain(quiet=DRAIN_QUIET, limit=min(DRAIN_LIMIT, max(0.0, deadline - time.monotonic())))
        await scheduler.remove_worker(worker.address, expected=True, close=False, stimulus_id=stimulus)
        self._gone.set()  # the cluster is its workers alone: a next run need not wait for the close below
        # a fetch begun before the others heard of the removal gets its answer, not a closed port
        # (no wait when the cluster itself is closing: nobody fetches then)
        end = time.monotonic() + CLOSE_GRACE
        while time.monotonic() < end and not self._closing.is_set():
            await asyncio.sleep(0.01)
        await worker.close(nanny=False, reason="quiver-bridge-retired")

    # -- waiting for it ----------------------------------------------------------------------
    def settle(self, timeout: float | None = None, closed: bool = False) -> None:
        """Wait until the workers started and the scheduler has no bridge (or the start failed);
        ``closed``: until the bridge worker has closed too (before the cluster closes)."""
        if self._thread is None:
            return
        timeout = self.timeout if timeout is None else timeout
        if closed:
            self._closing.set()
            self._thread.join(timeout)
        else:
            self._gone.wait(timeout)


_WORKER_CLASS: Any = None


def _worker_class() -> Any:
    """Dask's ``Worker`` with its heartbeat tracked (:func:`graph.cluster.heartbeats.track`: the retirement
    stops it for good, waiting for the beat in flight),
    and a :meth:`drain` of the requests for its data before it leaves (made once: ``distributed`` is
    imported only when a bridge starts)."""
    global _WORKER_CLASS
    if _WORKER_CLASS is None:
        from distributed import Worker

        from .heartbeats import track

        def data_asked(worker: Any) -> None:
            worker._last_request = time.monotonic()

        def status_sent(worker: Any, status: str) -> None:
            if status == "closing_gracefully":  # the scheduler's word of its retirement is in
                worker.told_retiring().set()

        class BridgeWorker(worker_with_hooks(Worker, data_asked, status_sent)):  # type: ignore[misc]
            """The bridge's worker: its heartbeat tracked (:mod:`graph.cluster.heartbeats`) and :meth:`drain` before it retires."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                track(self)  # its beat in flight is known: the retirement's stop waits for it

            _last_request = 0.0
            _told_retiring: asyncio.Event | None = None

            def told_retiring(self) -> asyncio.Event:
                if self._told_retiring is None:
                    self._told_retiring = asyncio.Event()
                return self._told_retiring

            async def drain(self, quiet: float, limit: float) -> None:
                """Let the requests for its data end before it leaves: first it serves them until
                none is in progress and none came for ``quiet`` s (a worker that knows only the bridge
                holds a key gets it), then it answers each one ``busy`` (Dask's own reply when a worker
                has too many transfers: the asker takes another holder at once, without an error)
                until none came for ``quiet`` s again; each phase ``limit`` s at most."""
                for busy in (False, True):
                    if busy:
                        refuse_transfers(self)
                    end = time.monotonic() + limit
                    while time.monotonic() < end and (transfers_out(self)
                                                      or time.monotonic() - self._last_request < quiet):
                        await asyncio.sleep(0.01)

        _WORKER_CLASS = BridgeWorker
    return _WORKER_CLASS


def _hand_over_queued(scheduler: Any, worker: Any) -> None:
    """Ask Dask's work stealing to move the tasks the scheduler has queued on the bridge that it
    has not started to the cluster's workers, least occupied first."""
    from distributed.core import Status

    stealing = scheduler.extensions.get("stealing")
    ws = scheduler.workers.get(worker.address)
    thieves = sorted((w for w in scheduler.workers.values() if w is not ws and w.status == Status.running),
                     key=lambda w: w.occupancy)
    if stealing is None or ws is None or not thieves:
        return
    started = executing_keys(worker)
    queued = [ts for ts in ws.processing if ts.key not in started]
    for i, ts in enumerate(queued):
        move_queued_task(stealing, ts, ws, thieves[i % len(thieves)])


def _all_known(scheduler: Any, worker: Any) -> bool:
    ws = scheduler.workers.get(worker.address)
    if ws is None:
        return True
    held = {ts.key for ts in ws.has_what}
    return all(key in held for key in list(worker.data))


def settle(cluster: Any, timeout: float | None = None, closed: bool = False) -> None:
    """Wait for ``cluster``'s bridge, if it has one, to retire (before the cluster is reused);
    ``closed``: and to close (before the cluster closes)."""
    bridge = getattr(cluster, "_quiver_bridge", None)
    if bridge is not None:
        bridge.settle(timeout, closed=closed)
