"""A scheduler plugin that records what one run really executed.

It watches the scheduler's own transitions (``processing -> memory|erred``) for
the run's keys, so ``executed_tasks`` counts work that actually ran (a task
recomputed after a worker loss counts twice), with compute seconds and output
sizes, and samples the workers' process memory and spilled bytes. It also keeps what the workers
report of each task's working memory (``graph.memory.working.WORKING_TOPIC``), counts the workers'
pauses (Dask's ``worker-status-change`` events), and, under a budget's guard, tells the run which
of its tasks were running on a worker that its nanny restarted for memory.  An iterative step's
compute leaves out the seconds it waited at rungs for the run's answer (it sends them on
``graph.tasks.iterative.WAIT_TOPIC`` before it ends): a branch's ``seconds`` are what it computed.

>>> m = RunMonitor("run-1", ["a", "b"])
>>> m.transition("a", "processing", "memory", startstops=({"action": "compute", "start": 1.0, "stop": 1.5},), nbytes=8)
>>> m.snapshot()["executed"], m.snapshot()["seconds"]
({'a': 1}, {'a': 0.5})
"""

from __future__ import annotations

import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ..cluster.bridge import NAME as BRIDGE
from ..keys import original_key
from ..memory.working import WORKING_TOPIC
from ..tasks.iterative import WAIT_TOPIC

__all__ = ["RunMonitor", "snapshot_on_scheduler"]


class RunMonitor(SchedulerPlugin):
    def __init__(self, run_id: str, keys, sample_interval: float = 0.1):
        self.name = f"quiver-{run_id}"
        self.keys = set(keys)
        self.sample_interval = sample_interval
        # key -> (times executed, compute seconds, output bytes or None): one small tuple per
        # key, the scheduler-side cost of a run (the record is read once, by ``snapshot``)
        self.record: dict[str, tuple[int, float, int | None]] = {}
        # key -> seconds its iterative step waited at rungs (graph.tasks.iterative.WAIT_TOPIC): not compute
        self.waited: dict[str, float] = {}
        self.working: dict[Any, int] = {}  # key -> working memory a worker measured (graph.memory.workmeter)
        self.on_bridge = 0  # tasks that finished on the bridge (graph.cluster.bridge): in the user's process
        #: key -> times Dask ran it again because its worker died while running it (TaskState.suspicious,
        #: bounded by distributed.scheduler.allowed-failures): infrastructure retries, not the step's
        self.rescheduled: dict[str, int] = {}
        self.pauses = 0  # times a worker paused (its memory passed Dask's pause line)
        self.paused_seconds = 0.0
        self._paused_since: dict[str, float] = {}
        self._workers: dict[str, tuple[int | None, int]] = {}  # address -> (memory limit, results in memory)
        self._killed: dict[str, dict] = {}  # address -> what is known of a worker restarted for memory
        self.peak_memory = 0
        self.peak_worker = 0
        self.limit: int | None = None
        self.topic: str | None = None
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
        for ws in workers:
            self._workers[ws.address] = (ws.memory_limit, ws.memory.managed)
        self.peak_memory = max(self.peak_memory, process)
        self.peak_worker = max([self.peak_worker] + [ws.memory.process for ws in workers])

    def log_event(self, topic: str, msg: Any) -> None:
        # every event of the cluster passes here: return at once unless it is one this run reads
        if not isinstance(msg, dict):
            return
        if topic == WORKING_TOPIC:
            self._working(msg)
            return
        action = msg.get("action")
        if action == "worker-status-change":  # topic: the worker's address
            self._status(topic, msg.get("status"))
            return
        if topic == "worker-restart-memory" or (topic == "all" and action == "remove-worker"):
            facts = self.worker_lost(topic, msg)
            if facts is not None and self.topic and self._scheduler is not None:
                self._scheduler.log_event(self.topic, facts)
            return
        if topic != WAIT_TOPIC:
            return
        key = original_key(msg.get("key", ""))
        if key in self.keys and isinstance(msg.get("seconds"), (int, float)):
            self.waited[key] = self.waited.get(key, 0.0) + msg["seconds"]

    def _working(self, msg: dict) -> None:
        key = msg.get("key")
        if isinstance(key, list):  # a partition key, as msgpack carries a tuple
            key = tuple(key)
        if isinstance(key, str):
            key = original_key(key)
        if key in self.keys and isinstance(msg.get("bytes"), int):
            self.working[key] = max(self.working.get(key, 0), msg["bytes"])

    def _status(self, worker: str, status: Any) -> None:
        now = time.monotonic()
        if status == "paused" and worker not in self._paused_since:
            self.pauses += 1
            self._paused_since[worker] = now
        elif status != "paused" and worker in self._paused_since:
            self.paused_seconds += now - self._paused_since.pop(worker)

    def worker_lost(self, topic: str, msg: dict) -> dict | None:
        """Pair a nanny's restart-for-memory (its reading) with the scheduler's removal of that
        worker (the tasks it was running), in whichever order they come: once both are in and
        some of the run's tasks ran there, the facts for the run to judge
        (``graph.memory.working.blame_killed``; published on the guard's topic), else ``None``.

        >>> m = RunMonitor("run-1", ["big-1"])
        >>> m.worker_lost("all", {"action": "remove-worker", "worker": "w1", "processing-tasks": {"big-1"}})
        >>> m.worker_lost("worker-restart-memory", {"worker": "w1", "pid": 7, "rss": 650})
        {'running': ['big-1'], 'rss': 650, 'limit': None, 'held': 0, 'killed': 'w1'}
        """
        worker = msg.get("worker")
        if not isinstance(worker, str):
            return None
        seen = self._killed.setdefault(worker, {})
        if topic == "worker-restart-memory":
            seen["rss"] = int(msg.get("rss") or 0)
            seen["limit"], seen["held"] = self._workers.get(worker, (None, 0))
        else:
            running = {original_key(k) if isinstance(k, str) else k for k in msg.get("processing-tasks") or ()}
            seen["running"] = sorted((k for k in running if k in self.keys), key=str)
        if "rss" not in seen or "running" not in seen:
            if "rss" not in seen and len(self._killed) > 64:  # removals for other reasons: keep few
                self._killed.pop(next(iter(self._killed)))
            return None
        facts = self._killed.pop(worker)
        return {**facts, "killed": worker} if facts["running"] else None

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        # called for every transition of every task on the scheduler: return at once unless
        # one of this run's tasks just finished computing
        if start != "processing":
            return
        if finish != "memory" and finish != "erred":
            if self._scheduler is not None and original_key(key) in self.keys:  # its worker died, Dask runs it again
                ts = self._scheduler.tasks.get(key)
                if ts is not None and ts.suspicious:
                    self.rescheduled[original_key(key)] = ts.suspicious
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
        if self._scheduler is not None:  # ran in the user's process while the workers started (graph.cluster.bridge)
            ws = self._scheduler.workers.get(kwargs.get("worker"))
            if ws is not None and ws.name == BRIDGE:
                self.on_bridge += 1
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
            "working": dict(self.working),
            "pauses": self.pauses,
            "paused_seconds": self.paused_seconds + sum(time.monotonic() - t for t in self._paused_since.values()),
            "peak_memory_bytes": self.peak_memory,
            "peak_worker_memory_bytes": self.peak_worker,
            "bridge_tasks": self.on_bridge,
            "rescheduled": dict(self.rescheduled),
        }


def snapshot_on_scheduler(dask_scheduler, name: str) -> dict[str, Any]:
    """``client.run_on_scheduler(snapshot_on_scheduler, name=...)``: read a monitor's record."""
    plugin = dask_scheduler.plugins.get(name)
    return plugin.snapshot() if plugin is not None else {}
