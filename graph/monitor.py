"""A scheduler plugin that records what one run really executed.

It watches the scheduler's own transitions (``processing -> memory|erred``) for
the run's keys, so ``executed_tasks`` counts work that actually ran (a task
recomputed after a worker loss counts twice), with compute seconds and output
sizes, and samples the workers' process memory and spilled bytes.

>>> m = RunMonitor("run-1", ["a", "b"])
>>> m.transition("a", "processing", "memory", startstops=({"action": "compute", "start": 1.0, "stop": 1.5},), nbytes=8)
>>> m.snapshot()["executed"], m.snapshot()["seconds"]
({'a': 1}, {'a': 0.5})
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["RunMonitor", "snapshot_on_scheduler"]


class RunMonitor(SchedulerPlugin):
    def __init__(self, run_id: str, keys, sample_interval: float = 0.1):
        self.name = f"quiver-{run_id}"
        self.keys = set(keys)
        self.sample_interval = sample_interval
        self.executed: Counter = Counter()
        self.seconds: dict[str, float] = {}
        self.nbytes: dict[str, int] = {}
        self.peak_memory = 0
        self.peak_worker = 0
        self.peak_spilled = 0
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
        self.peak_spilled = max(self.peak_spilled, spilled)
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if not self.timeline or now - self._t0 - self.timeline[-1][0] >= 0.25:
            self.timeline.append((round(now - self._t0, 3), int(process), int(spilled)))
            if len(self.timeline) > 4000:  # long runs: keep every other sample
                self.timeline = self.timeline[::2]

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        if start != "processing" or finish not in ("memory", "erred"):
            return
        if isinstance(key, str) and "~again" in key:  # the executor's recompute copy of a key
            key = key.split("~again", 1)[0]
        if key not in self.keys:
            return
        self.executed[key] += 1
        compute = 0.0
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                compute += ss["stop"] - ss["start"]
        self.seconds[key] = self.seconds.get(key, 0.0) + compute
        if kwargs.get("nbytes") is not None:
            self.nbytes[key] = kwargs["nbytes"]
            if self.limit is not None and self.topic and kwargs["nbytes"] > self.limit and self._scheduler:
                from .memory.budget import oversized_message

                self._scheduler.log_event(self.topic, oversized_message(key, kwargs["nbytes"], self.limit))

    def snapshot(self) -> dict[str, Any]:
        self.sample()
        return {
            "executed": dict(self.executed),
            "seconds": dict(self.seconds),
            "nbytes": dict(self.nbytes),
            "peak_memory_bytes": self.peak_memory,
            "peak_worker_memory_bytes": self.peak_worker,
            "spilled_bytes": self.peak_spilled,
            "timeline": list(self.timeline),
        }


def snapshot_on_scheduler(dask_scheduler, name: str) -> dict[str, Any]:
    """``client.run_on_scheduler(snapshot_on_scheduler, name=...)``: read a monitor's record."""
    plugin = dask_scheduler.plugins.get(name)
    return plugin.snapshot() if plugin is not None else {}
