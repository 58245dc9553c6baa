"""A scheduler plugin that records what one run really executed.

It watches the scheduler's own transitions (``processing -> memory|erred``) for
the run's keys, so ``executed_tasks`` counts work that actually ran (a task
recomputed after a worker loss counts twice), with compute seconds and output
sizes, and samples the workers' process memory and spilled bytes.  An iterative step's
compute leaves out the seconds it waited at rungs for the run's answer (it sends them on
``graph.iterative.WAIT_TOPIC`` before it ends): a branch's ``seconds`` are what it computed.

>>> m = RunMonitor("run-1", ["a", "b"])
>>> m.transition("a", "processing", "memory", startstops=({"action": "compute", "start": 1.0, "stop": 1.5},), nbytes=8)
>>> m.snapshot()["executed"], m.snapshot()["seconds"]
({'a': 1}, {'a': 0.5})
"""

from __future__ import annotations

import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .iterative import WAIT_TOPIC
from .keys import original_key

__all__ = ["RunMonitor", "snapshot_on_scheduler"]


class RunMonitor(SchedulerPlugin):
    def __init__(self, run_id: str, keys, sample_interval: float = 0.1):
        self.name = f"quiver-{run_id}"
        self.keys = set(keys)
        self.sample_interval = sample_interval
        # key -> (times executed, compute seconds, output bytes or None): one small tuple per
        # key, the scheduler-side cost of a run (the record is read once, by ``snapshot``)
        self.record: dict[str, tuple[int, float, int | None]] = {}
        # key -> seconds its iterative step waited at rungs (graph.iterative.WAIT_TOPIC): not compute
        self.waited: dict[str, float] = {}
        self.peak_memory = 0
        self.peak_worker = 0
        self.timeline: list[tuple[float, int, int]] = []  # (seconds, process bytes, spilled bytes)
        self.limit: int | None = None
        self.topic: str | None = None
        self._t0: float | None = None
        self._scheduler = None
        self._callback = None

    def guard(self, limit: int | None, topic: str | None) -> None:
        """Publish an abort on ``topic`` when one of the run's results exceeds ``limit`` bytes."""
        self.limit, self.topic = limit, topic

    async def start(self, scheduler) -> None:
        from tornado.ioloop import PeriodicCallback

        self._scheduler = scheduler
        self._callback = PeriodicCallback(self.sample, self.sample_interval * 1000)
        self._callback.start()

    async def close(self) -> None:
        if self._callback is not None:
            self._callback.stop()

    def remove_worker(self, scheduler=None, worker=None, **kwargs) -> None:
        self.sample()

    def sample(self) -> None:
        if self._scheduler is None:
            return
        workers = self._scheduler.workers.values()
        process = sum(ws.memory.process for ws in workers)
        spilled = sum(ws.memory.spilled for ws in workers)
        self.peak_memory = max(self.peak_memory, process)
        self.peak_worker = max([self.peak_worker] + [ws.memory.process for ws in workers])
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if not self.timeline or now - self._t0 - self.timeline[-1][0] >= 0.25:
            self.timeline.append((round(now - self._t0, 3), int(process), int(spilled)))
            if len(self.timeline) > 4000:  # long runs: keep every other sample
                self.timeline = self.timeline[::2]

    def log_event(self, topic: str, msg: Any) -> None:
        # every event of the cluster passes here: return at once unless it is a wait of this run's
        if topic != WAIT_TOPIC or not isinstance(msg, dict):
            return
        key = original_key(msg.get("key", ""))
        if key in self.keys and isinstance(msg.get("seconds"), (int, float)):
            self.waited[key] = self.waited.get(key, 0.0) + msg["seconds"]

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        # called for every transition of every task on the scheduler: return at once unless
        # one of this run's tasks just finished computing
        if start != "processing" or (finish != "memory" and finish != "erred"):
            return
        key = original_key(key)  # the executor's recompute copy of a key counts as the key
        if key not in self.keys:
            return
        compute = 0.0
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                compute += ss["stop"] - ss["start"]
        compute = max(0.0, compute - self.waited.pop(key, 0.0))  # an iterative step's waits at rungs are not compute
        n, seconds, nbytes = self.record.get(key, (0, 0.0, None))
        size = kwargs.get("nbytes")
        self.record[key] = (n + 1, seconds + compute, nbytes if size is None else size)
        if size is not None and self.limit is not None and self.topic and size > self.limit and self._scheduler:
            # the client side words it (graph.memory.budget): the monitor imports nothing of it
            self._scheduler.log_event(self.topic, {"key": key, "nbytes": size, "limit": self.limit})

    def snapshot(self) -> dict[str, Any]:
        self.sample()
        return {
            "executed": {k: r[0] for k, r in self.record.items()},
            "seconds": {k: r[1] for k, r in self.record.items()},
            "nbytes": {k: r[2] for k, r in self.record.items() if r[2] is not None},
            "peak_memory_bytes": self.peak_memory,
            "peak_worker_memory_bytes": self.peak_worker,
            "timeline": list(self.timeline),
        }


def snapshot_on_scheduler(dask_scheduler, name: str) -> dict[str, Any]:
    """``client.run_on_scheduler(snapshot_on_scheduler, name=...)``: read a monitor's record."""
    plugin = dask_scheduler.plugins.get(name)
    return plugin.snapshot() if plugin is not None else {}
