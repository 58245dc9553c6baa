"""Where a run's time went, as data: the workers' thread-seconds split by what filled them.

After a run, Dask's own task stream (the scheduler's ``TaskStreamPlugin`` records: per task its
worker, thread and ``startstops``, the compute, transfer, disk and deserialize intervals) is cut
to the run's window and every worker thread's time in it is given to one category:

* ``importing``: while every worker imports the steps' libraries before the first task
  (graph/cluster/warmup.py; the ``imports`` interval the runner measured around it);
* ``startup``: after that, before the worker's first task of the run began (scheduling, and
  waiting for a first task while the exploration is still narrow);
* ``loading``: computing a source step (a task with no inputs: the data loaders);
* ``moving``: no task computing on the thread while its worker fetches, reads back or
  deserialises a task's inputs (Dask runs those off the threads: a thread is only charged for
  it when it has nothing else to do);
* ``computing``: every other step's compute;
* ``waiting``: an iterative step waiting at a rung for the run's answer (it holds its thread:
  from the report to the answer, the spans the step sends on ``graph.tasks.iterative.WAIT_TOPIC``);
* ``idle``: the rest: a thread with nothing to run.

Each figure is thread-seconds over the number of threads, so they add up to the window's
length: ``sum(categories) == window_s``; ``idle_thread_seconds`` is the idle time of all the
threads together (worker-thread-seconds with nothing to run). :func:`breakdown` is the pure rule (literal records in,
numbers out); :class:`Collector` is the thin part that talks to the scheduler.

>>> recs = [{"key": "load", "worker": "w", "startstops": [{"action": "compute", "start": 1.0, "stop": 2.0}]},
...         {"key": "fit", "worker": "w", "startstops": [{"action": "transfer", "start": 2.0, "stop": 2.5},
...                                                        {"action": "compute", "start": 2.5, "stop": 4.0}]}]
>>> breakdown(recs, 0.0, 5.0, {"w": 1}, sources={"load"})  # doctest: +NORMALIZE_WHITESPACE
{'window_s': 5.0, 'threads': 1, 'importing': 0.0, 'startup': 1.0, 'loading': 1.0, 'moving': 0.5,
 'computing': 1.5, 'waiting': 0.0, 'idle': 1.0, 'idle_thread_seconds': 1.0}
>>> breakdown(recs, 0.0, 5.0, {"w": 1}, sources={"load"}, imports=(0.0, 0.75))["importing"]
0.75
>>> out = breakdown(recs, 0.0, 5.0, {"w": 1}, sources={"load"}, waits=[("w", 3.0, 3.5)])  # fit waited at a rung
>>> out["computing"], out["waiting"]
(1.0, 0.5)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["CATEGORIES", "STARTUP_NOTE_SHARE", "Collector", "breakdown", "released_records", "source_keys",
           "startup_note", "startup_share", "wait_spans"]

#: ``run()`` says how much of its wall was start-up when that share is above this
STARTUP_NOTE_SHARE = 0.30

CATEGORIES = ("importing", "startup", "loading", "moving", "computing", "waiting", "idle")
_MOVING = {"transfer", "disk-read", "disk-write", "deserialize"}


def startup_share(stats: Mapping[str, Any]) -> tuple[float, dict[str, float]] | None:
    """The share of a run's wall that went to starting up, and its parts: ``cluster`` (starting
    or connecting to the cluster, ``stats["cluster_seconds"]``), ``importing`` (the workers
    importing the steps' libraries) and ``first task`` (before each worker's first task:
    scheduling, a narrow start), the last two from ``stats["time_breakdown"]``. The wall:
    compile, cluster and the breakdown's window. ``None`` without a breakdown.

    >>> share, parts = startup_share({"compile_seconds": 0.5, "cluster_seconds": 3.0,
    ...     "time_breakdown": {"window_s": 6.5, "importing": 1.5, "startup": 0.5}})
    >>> round(share, 2), parts
    (0.5, {'cluster': 3.0, 'importing': 1.5, 'first task': 0.5})
    """
    tb = stats.get("time_breakdown")
    if not isinstance(tb, Mapping) or not tb.get("window_s"):
        return None
    wall = float(stats.get("compile_seconds") or 0.0) + float(stats.get("cluster_seconds") or 0.0) + float(tb["window_s"])
    parts = {"cluster": float(stats.get("cluster_seconds") or 0.0), "importing": float(tb.get("importing") or 0.0),
             "first task": float(tb.get("startup") or 0.0)}
    return (sum(parts.values()) / wall if wall > 0 else 0.0), parts


def startup_note(stats: Mapping[str, Any], threshold: float = STARTUP_NOTE_SHARE) -> str | None:
    """The line ``run()`` prints at its end (unless ``quiet``) when start-up took more than
    ``threshold`` of the wall: a short run is then mostly start-up, which a second run on the
    kept cluster, or one process, does not pay.

    >>> print(startup_note({"compile_seconds": 0.5, "cluster_seconds": 3.0, "cluster": "started",
    ...     "time_breakdown": {"window_s": 6.5, "importing": 1.5, "startup": 0.5}}))
    [quiver] start-up took 50% of this run's 10.0 s (cluster 3.0 s, workers importing the steps' libraries 1.5 s, \
before the first tasks 0.5 s); the next run in this process reuses the kept cluster (docs/guide/speed.md)
    >>> startup_note({"cluster_seconds": 0.1, "time_breakdown": {"window_s": 9.9}}) is None
    True
    """
    found = startup_share(stats)
    if found is None or found[0] <= threshold:
        return None
    share, parts = found
    wall = float(stats.get("compile_seconds") or 0.0) + float(stats.get("cluster_seconds") or 0.0) + \
        float(stats["time_breakdown"]["window_s"])
    return (f"[quiver] start-up took {share:.0%} of this run's {wall:.1f} s (cluster {parts['cluster']:.1f} s, "
            f"workers importing the steps' libraries {parts['importing']:.1f} s, before the first tasks "
            f"{parts['first task']:.1f} s)"
            + ("; the next run in this process reuses the kept cluster" if stats.get("cluster") == "started" else "")
            + " (docs/guide/speed.md)")


def source_keys(graph: Mapping[str, Any]) -> set[str]:
    """The keys of ``graph`` (key -> ``dask.task_spec`` task) whose task reads no other task.

    >>> from dask.task_spec import Task, TaskRef
    >>> sorted(source_keys({"a": Task("a", int, 1), "b": Task("b", str, TaskRef("a"))}))
    ['a']
    """
    return {k for k, t in graph.items() if not getattr(t, "dependencies", ())}


def _clip(a: float, b: float, lo: float, hi: float) -> tuple[float, float] | None:
    a, b = max(a, lo), min(b, hi)
    return (a, b) if b > a else None


def breakdown(records: Iterable[Mapping[str, Any]], start: float, end: float, threads: Mapping[str, int],
              sources: Iterable[str] = (), key_of=None, imports: tuple[float, float] | None = None,
              waits: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
    """Split the window ``[start, end]`` of every worker thread into :data:`CATEGORIES`.

    ``records``: task-stream records (``key``, ``worker``, ``startstops``: dicts with
    ``action``, ``start``, ``stop`` in the workers' clock); ``threads``: worker -> thread count
    (workers with no record are idle all along); ``sources``: the keys of source steps;
    ``key_of``: maps a record's key to the key ``sources`` names (e.g. a recompute copy to its
    original); ``imports``: the ``(start, stop)`` of the workers' imports before the run (a
    thread with nothing to do then is importing); ``waits``: ``(worker, start, stop)`` of each
    wait of an iterative step at a rung (:func:`wait_spans`), inside that step's compute: that
    much of its compute is ``waiting`` instead of ``computing``. Intervals are clipped to the
    window; where a worker's computing intervals overlap more than it has threads (clock
    jitter), they are scaled down to its threads.

    >>> breakdown([], 0.0, 2.0, {"a": 2, "b": 1})["idle"]
    2.0
    >>> breakdown([], 1.0, 1.0, {"a": 1})["window_s"]
    0.0
    """
    if end < start:
        raise ValueError(f"breakdown: the window ends ({end}) before it starts ({start}); pass start <= end")
    sources = set(sources)
    per_worker: dict[str, list[tuple[float, float, str]]] = {w: [] for w in threads}
    for rec in records:
        worker = rec.get("worker")
        if worker not in per_worker:
            continue  # a worker that left: its threads are not in the count either
        key = key_of(rec["key"]) if key_of is not None else rec["key"]
        for ss in rec.get("startstops") or ():
            span = _clip(float(ss["start"]), float(ss["stop"]), start, end)
            if span is None:
                continue
            action = ss.get("action")
            if action == "compute":
                per_worker[worker].append((*span, "loading" if key in sources else "computing"))
            elif action in _MOVING:
                per_worker[worker].append((*span, "moving"))
    for worker, a, b in waits:
        span = _clip(float(a), float(b), start, end)
        if worker in per_worker and span is not None:
            per_worker[worker].append((*span, "waiting"))
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for worker, n in threads.items():
        if n <= 0:
            continue
        spans = per_worker[worker]
        first = min((a for a, _, c in spans if c in ("loading", "computing")), default=start)  # never computed: idle
        # a sweep over the spans' ends: how many of each kind are active between two events
        marks = [(first, 0, "")]
        imp = _clip(*imports, start, end) if imports else None
        if imp:
            marks += [(imp[0], 1, "importing"), (imp[1], -1, "importing")]
        events = sorted([(a, 1, c) for a, _, c in spans] + [(b, -1, c) for _, b, c in spans] + marks)
        active = {"loading": 0, "computing": 0, "waiting": 0, "moving": 0, "importing": 0}
        at = start
        for t, delta, kind in events + [(end, 0, "")]:
            if t > at:
                length = t - at
                busy = active["loading"] + active["computing"]
                scale = min(1.0, n / busy) if busy else 0.0
                # a wait lies inside its step's compute: that part of the compute is waiting
                waiting = min(active["waiting"], active["computing"])
                totals["loading"] += active["loading"] * scale * length
                totals["computing"] += (active["computing"] - waiting) * scale * length
                totals["waiting"] += waiting * scale * length
                free = (n - min(busy, n)) * length
                if active["moving"]:
                    totals["moving"] += free
                elif active["importing"]:
                    totals["importing"] += free
                elif t <= first:
                    totals["startup"] += free
                else:
                    totals["idle"] += free
                at = t
            if kind:
                active[kind] += delta
    count = sum(n for n in threads.values() if n > 0)
    out: dict[str, float] = {"window_s": end - start, "threads": count}
    out.update({c: (totals[c] / count if count else 0.0) for c in CATEGORIES})
    out["idle_thread_seconds"] = totals["idle"]
    return out


def wait_spans(messages: Iterable[Any], keys: Iterable[str], key_of=None) -> list[tuple[str, float, float]]:
    """``(worker, start, stop)`` of every rung wait in ``messages`` (the ``graph.tasks.iterative.WAIT_TOPIC``
    messages: ``{"key", "worker", "spans"}``) of a task in ``keys``; malformed ones are left out.

    >>> wait_spans([{"key": "fit", "worker": "w", "spans": [[1.0, 2.0]]}, {"key": "other", "spans": []}, None], {"fit"})
    [('w', 1.0, 2.0)]
    """
    out = []
    for msg in _runs_messages(messages, keys, key_of):
        for span in msg.get("spans") or ():
            pair = _span(span)
            if pair is not None:
                out.append((msg.get("worker"), *pair))
    return out


def _runs_messages(messages: Iterable[Any], keys: Iterable[str], key_of=None) -> Iterable[Mapping]:
    """The ``WAIT_TOPIC`` messages (mappings) of a task in ``keys`` (through ``key_of``)."""
    wanted = set(keys)
    for msg in messages:
        if not isinstance(msg, Mapping):
            continue
        key = msg.get("key")
        if (key_of(key) if key_of is not None and isinstance(key, str) else key) in wanted:
            yield msg


def _span(span: Any) -> tuple[float, float] | None:
    """``(start, stop)`` as floats, ``None`` when malformed."""
    try:
        return float(span[0]), float(span[1])
    except (TypeError, ValueError, IndexError):
        return None


def released_records(messages: Iterable[Any], keys: Iterable[str], key_of=None) -> list[dict]:
    """Task-stream-like records of the tasks in ``keys`` that the run released while they ran
    (a pruned group's packed task, an iterative step whose branch was cancelled): Dask's task
    stream keeps none for them, so their ``graph.tasks.iterative.WAIT_TOPIC`` message carries the
    span they ran (``"released"``); without it their seconds would read as ``idle``.

    >>> released_records([{"key": "pack", "worker": "w", "spans": [], "released": [1.0, 3.0]},
    ...                   {"key": "fit", "worker": "w", "spans": [[1.0, 2.0]]}], {"pack", "fit"})
    [{'key': 'pack', 'worker': 'w', 'startstops': [{'action': 'compute', 'start': 1.0, 'stop': 3.0}]}]
    """
    out = []
    for msg in _runs_messages(messages, keys, key_of):
        pair = _span(msg.get("released") or ())
        if pair is not None:
            out.append({"key": msg.get("key"), "worker": msg.get("worker"),
                        "startstops": [{"action": "compute", "start": pair[0], "stop": pair[1]}]})
    return out


def _begin_on_scheduler(dask_scheduler) -> int:
    """Make sure the scheduler keeps a task stream; its record count now (the run's first)."""
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    plugin = dask_scheduler.plugins.get(TaskStreamPlugin.name)
    if plugin is None:
        plugin = TaskStreamPlugin(dask_scheduler)
        dask_scheduler.add_plugin(plugin)
    return plugin.index


def _records_on_scheduler(dask_scheduler, start_index: int, keys: list[str]) -> list[dict]:
    """The run's records since ``start_index``: key, worker and startstops only."""
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    from ..keys import original_key

    plugin = dask_scheduler.plugins.get(TaskStreamPlugin.name)
    if plugin is None:
        return []
    wanted = set(keys)
    return [{"key": r["key"], "worker": r.get("worker"), "startstops": list(r.get("startstops") or ())}
            for r in plugin.collect(start_index=start_index) if original_key(r["key"]) in wanted]


def _waits_on_scheduler(dask_scheduler, since: float) -> list[dict]:
    """The rung-wait messages (``graph.tasks.iterative.WAIT_TOPIC``) the scheduler logged since ``since``."""
    from ..tasks.iterative import WAIT_TOPIC

    return [msg for t, msg in dask_scheduler.get_events(WAIT_TOPIC) if t >= since]


class Collector:
    """The thin part: ``begin()`` before a run (before the workers' imports), ``imported()``
    after the imports, ``finish(compiled)`` after the run, on one client.

    Each is one bounded call to the scheduler (``graph.bounded.within``, ``timeout`` seconds); a
    scheduler that does not answer, or a run too long for the task stream's buffer, gives
    ``None`` (a breakdown never fails a run)."""

    def __init__(self, client, timeout: float = 10.0):
        self.client, self.timeout = client, timeout
        self.start: float | None = None
        self.imports: tuple[float, float] | None = None
        self.index: int | None = None

    def begin(self) -> None:
        import time

        from ..bounded import NoAnswer, within

        try:
            self.index = within(time.monotonic() + self.timeout, self.client.run_on_scheduler, _begin_on_scheduler,
                                what="starting the task stream")
        except (NoAnswer, OSError):
            self.index = None
        self.start = time.time()

    def imported(self) -> None:
        import time

        if self.start is not None:
            self.imports = (self.start, time.time())

    def finish(self, compiled) -> dict[str, float] | None:
        """The breakdown of the run of ``compiled`` (its step and metric tasks) since ``begin()``."""
        import time

        from ..bounded import NoAnswer, within
        from ..keys import original_key

        end = time.time()
        if self.index is None or self.start is None:
            return None
        deadline = time.monotonic() + self.timeout
        try:
            keys = list(compiled.graph) + list(compiled.metric_graph)
            records = within(deadline, self.client.run_on_scheduler, _records_on_scheduler, start_index=self.index,
                             keys=keys, what="reading the task stream")
            threads = within(deadline, self.client.nthreads, what="counting the worker threads")
            waits = within(deadline, self.client.run_on_scheduler, _waits_on_scheduler, since=self.start,
                           what="reading the rung waits")
        except (NoAnswer, OSError):
            return None
        records = [*records, *released_records(waits, keys, key_of=original_key)]
        return breakdown(records, self.start, end, threads, source_keys(compiled.graph), key_of=original_key,
                         imports=self.imports, waits=wait_spans(waits, keys, key_of=original_key))
