"""On the workers: measure each task's working memory, and hold a task back until it has room.

:class:`WorkingMemoryPlugin` is the thin layer over the rules of :mod:`graph.memory.working`:

* **measuring**: when a task starts executing, the worker's process memory is read and the
  kernel's peak-memory mark (``VmHWM``) is reset (``/proc/self/clear_refs``); when it stops, the
  peak since then less the memory at its start is its working memory (no sampling, so a
  temporary that lives a millisecond counts). Tasks running at the same time on one worker share
  the peak (each is charged with it: an upper bound). Without ``/proc`` (not Linux) the memory at
  the task's end stands for the peak. The first ``first`` instances of each step per worker are
  reported to the scheduler (topic :data:`graph.memory.working.WORKING_TOPIC`), where the run's
  monitor keeps them;
* **admission**: before a task starts, if the worker's process memory plus the working memory
  measured for its step would pass Dask's pause line (:func:`graph.memory.working.room_to_make`),
  the worker writes held results that the task does not read to disk first (the plan's victim
  order when a plan is installed, else least recently used), so the task runs under the line
  instead of pausing the worker;
* **forgetting**: a task that has run forgets its run_spec (:mod:`graph.memory.finished`), which
  Dask would keep for as long as the lineage of a held result stays known on the worker.

>>> p = WorkingMemoryPlugin("quiver-working-1", {"fit": 100})
>>> p.learned
{'fit': 100}
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .finished import drop_finished_spec
from .sizes import step_of
from .spill import evictable, planned_rank
from .working import WORKING_TOPIC, room_to_make, working_of

__all__ = ["WorkingMemoryPlugin", "update_working_on_worker"]

logger = logging.getLogger("quiver.workmeter")


def _status_bytes(field: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of this process in bytes (``None`` without ``/proc``)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-memory mark to the current memory (Linux 4.0+); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss() -> int:
    n = _status_bytes("VmRSS:")
    if n is None:
        import psutil

        n = psutil.Process().memory_info().rss
    return n


class WorkingMemoryPlugin(WorkerPlugin):
    """Measure the working memory of a run's tasks on each worker and admit tasks by it."""

    def __init__(self, name: str, learned: Mapping[str, int] | None = None, first: int = 3):
        self.name = name
        self.learned = dict(learned or {})  # step name -> largest working memory measured
        self.first = first
        self.worker: Any = None
        self.running: dict[Any, list[int]] = {}  # key -> [memory at its start, peak since]
        self.reported: dict[str, int] = {}
        self.peaks = True
        self.arrow_before: Any = None  # pyarrow's pool before the run's (restored at teardown)
        self.arrow_done = False

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.peaks = _reset_peak() and _status_bytes("VmHWM:") is not None

    def _fold(self) -> None:
        """Charge the peak since the last reset to every running task, then reset it."""
        if not self.running:
            return
        peak = _status_bytes("VmHWM:") if self.peaks else _rss()
        for rec in self.running.values():
            rec[1] = max(rec[1], peak or 0)

    def teardown(self, worker: Any) -> None:
        if self.arrow_before is not None:
            import pyarrow

            pyarrow.set_memory_pool(self.arrow_before)
            self.arrow_before = None

    def _system_arrow_pool(self) -> None:
        """Once pyarrow is loaded, its buffers (Parquet reads) come from the system allocator for
        the run: pyarrow's own pool (mimalloc) keeps freed memory, unmanaged memory the budget
        cannot see (it kept 40-55 MiB of a process that read 200 of big_table_explore's Parquet
        files; the system pool 6 MiB). Buffers already made keep the pool they came from."""
        if self.arrow_done or "pyarrow" not in sys.modules:
            return
        self.arrow_done = True
        import pyarrow

        before = pyarrow.default_memory_pool()
        if before.backend_name != "system":
            self.arrow_before = before
            pyarrow.set_memory_pool(pyarrow.system_memory_pool())

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            self._system_arrow_pool()
            self._admit(key)
            self._fold()
            if self.peaks:
                _reset_peak()
            now = _rss()
            self.running[key] = [now, now]
        elif start == "executing" and key in self.running:
            self._fold()
            before, peak = self.running.pop(key)
            if self.peaks:
                _reset_peak()
            self._record(key, max(peak - before, 0))
        state = getattr(self.worker, "state", None)
        if state is not None:
            drop_finished_spec(state.tasks, key, start, finish)

    def _record(self, key: Any, nbytes: int) -> None:
        step = step_of(key)
        self.learned[step] = max(self.learned.get(step, 0), nbytes)
        n = self.reported.get(step, 0)
        if n < self.first and self.worker is not None:
            self.reported[step] = n + 1
            try:
                self.worker.log_event(WORKING_TOPIC, {"key": key, "bytes": int(nbytes)})
            except Exception as exc:  # recorded: the worker is closing; the measurement is only a report
                logger.debug("quiver: working memory of %s not reported: %s", key, exc)

    def _admit(self, key: Any) -> None:
        """Write held results the task does not read to disk until its expected working memory
        fits under the pause line (or nothing more can go)."""
        worker = self.worker
        manager = getattr(worker, "memory_manager", None)
        if manager is None:
            return
        need = room_to_make(_rss(), working_of(key, {}, self.learned), manager.memory_limit,
                            manager.memory_pause_fraction)
        fast = getattr(getattr(worker, "data", None), "fast", None)
        if need <= 0 or fast is None or not hasattr(fast, "evict"):
            return
        ts = worker.state.tasks.get(key)
        inputs = {d.key for d in ts.dependencies} if ts is not None else set()
        freed = 0
        while freed < need:
            victims = [k for k in _victim_order(fast) if k not in inputs]
            if not victims:
                break
            weight = _evict(worker.data, victims[0])
            if weight <= 0:
                break
            freed += weight
        if freed:
            logger.info("quiver: %s held back until %d bytes of results went to disk", key, freed)


def _evict(data: Any, key: Any) -> int:
    """Write ``key`` to disk as Dask's ``SpillBuffer.evict`` does (its spill counters and its
    handling of a full disk or an unpicklable value), but this key; bytes freed, -1 if it failed."""
    from distributed.spill import HandledError

    from .._dask import spill_accounting

    try:
        with spill_accounting(data):  # Dask's spill counters kept (none when not Dask's SpillBuffer)
            return int(data.fast.evict(key)[2] or 0)
    except HandledError:  # logged by Dask (disk full, max_spill reached, a value that cannot be pickled)
        return -1


def _victim_order(fast: Any) -> list:
    """The keys a worker's in-memory results would be evicted in: the installed plan's order
    (graph.memory.spill.PlannedLRU: furthest next use first), else least recently used first."""
    plan = getattr(fast, "plan", None)
    keys = evictable(fast)
    if plan is not None:
        keys.sort(key=planned_rank(fast, plan), reverse=True)  # the order PlannedLRU.evict takes them in
    return keys


def update_working_on_worker(dask_worker: Any, name: str, learned: Mapping[str, int]) -> bool:
    """``client.run(update_working_on_worker, name=..., learned=...)``: what other workers
    measured, so a worker admits a step's first instance on it by their measurements too."""
    plugin = dask_worker.plugins.get(name)
    if plugin is None:
        return False
    for step, n in learned.items():
        plugin.learned[step] = max(plugin.learned.get(step, 0), int(n))
    return True
