"""Memory over time, per worker: the samples a run collects, how they are thinned, what a chart draws.

Pure (no Dask import): the dashboard's scheduler plugin feeds :class:`MemoryTimeline` with Dask's
own readings of each worker (``WorkerState.memory``: managed, unmanaged, spilled bytes, and the
worker's ``memory_limit``); the exploration page and the HTML report draw :func:`worker_series`
of the same JSON data, so both show the same lines.

* **bounded**: a run keeps at most ``limit`` samples (2,000): when a new one would pass it, the
  samples are thinned evenly to half (:func:`thin_indices`) and later ones recorded half as often,
  always keeping the first, the last and the one where a worker held the most (a stall's peak is
  never thinned away);
* **per worker predicted peak** (:func:`predicted_worker_peak`): the memory plan models each
  worker as holding up to its own share, so its predicted total divides evenly.

>>> t = MemoryTimeline(limit=10, pause=0.8)
>>> for s in range(14):   # every 0.5 s; a peak at 1.5 s
...     t.add(s * 0.5, {"tcp://a": (900 if s == 3 else s * 10, 50, 0, 1000)})
>>> d = t.data()          # thinned once: one second apart from then on, the peak kept
>>> d["t"], d["workers"]["tcp://a"]["managed"]
([0.0, 1.5, 2.0, 3.5, 4.5, 5.5, 6.5], [0, 900, 40, 70, 90, 110, 130])
>>> worker_series(d, predicted_peak=900)[0]["predicted"]
[900.0]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["IN_VIEW", "MAX_READINGS", "MAX_SAMPLES", "MEMORY_COLORS", "SAMPLE_SECONDS", "MemoryTimeline", "predicted_worker_peak", "thin_indices", "totals", "worker_series"]

#: at most this many samples per run (thinned evenly past it)
MAX_SAMPLES = 2000
#: how often the dashboard's plugin samples the workers while a run is in progress
SAMPLE_SECONDS = 0.5
#: at most this many readings (samples x workers) per run: a large cluster gets fewer samples,
#: so a scheduler keeps a few MiB per run whatever its size (2,000 samples up to 25 workers)
MAX_READINGS = 50_000

_FIELDS = ("managed", "unmanaged", "spilled")

#: the memory chart's colours, on the dashboard and in the report: the stacked areas, the spilled
#: line, the worker's limit, Dask's pause line and the plan's predicted peak
MEMORY_COLORS = {"managed": "#3182bd", "unmanaged": "#9ecae1", "spilled": "#e6550d", "limit": "#252525",
                 "pause": "#d62728", "predicted": "#31a354"}


def thin_indices(peaks: Sequence[float], limit: int) -> list[int]:
    """Which of ``len(peaks)`` samples to keep so that at most ``limit`` remain: evenly spaced,
    always with the first, the last and the (first) largest of ``peaks``. All of them when they fit.

    >>> thin_indices([1, 5, 2, 3, 4, 1, 2], 4)
    [0, 1, 3, 6]
    >>> thin_indices([1, 2, 3], 10)
    [0, 1, 2]
    >>> thin_indices([9, 1, 1, 1, 1], 3)
    [0, 2, 4]
    """
    n = len(peaks)
    if limit < 3:
        raise ValueError(f"thin_indices: limit={limit!r} cannot keep the first, the last and the largest sample; give 3 or more")
    if n <= limit:
        return list(range(n))
    top = max(range(n), key=lambda i: (peaks[i], -i))
    slots = limit - 1 if top not in (0, n - 1) else limit  # one slot saved for the largest
    even = {round(j * (n - 1) / (slots - 1)) for j in range(slots)} if slots > 1 else {0, n - 1}
    return sorted(even | {top})


def _peak(readings: Mapping[str, Sequence[int]]) -> int:
    return max((int(r[0]) + int(r[1]) for r in readings.values()), default=0)


class MemoryTimeline:
    """One run's samples: seconds since its first sample, and per worker managed / unmanaged /
    spilled bytes (``None`` where a worker was not there) and its memory limit.

    Evenly thinned as it grows: past ``limit`` samples (fewer on a cluster of more than
    ``max_readings / limit`` workers) the recorded ones are halved
    (:func:`thin_indices`) and from then on one sample in two is recorded (the larger of the
    two: a peak between recorded samples is not lost), and so on; the latest sample is always in
    :meth:`data`. ``pause``/``spill``: Dask's thresholds as fractions of each worker's limit
    (``None``: off), drawn as lines (:func:`graph.memory.limits.dask_thresholds` gives them)."""

    def __init__(self, limit: int = MAX_SAMPLES, pause: float | None = None, spill: float | None = None,
                 max_readings: int = MAX_READINGS):
        if not isinstance(limit, int) or limit < 8:
            raise ValueError(f"MemoryTimeline: limit={limit!r}; give an int of at least 8 samples")
        self.limit = limit
        self.max_readings = max_readings
        self.pause, self.spill = pause, spill
        self.rows: list[tuple[float, int, dict]] = []  # (seconds, largest process memory of a worker, readings)
        self.stride = 1  # record one sample in ``stride`` (the window's largest)
        self._window: tuple | None = None  # the largest sample of the window being filled
        self._seen = 0
        self._latest: tuple | None = None
        self._t0: float | None = None

    def add(self, now: float, readings: Mapping[str, Sequence[int]]) -> None:
        """One sample at ``now`` (seconds, any clock): ``{worker: (managed, unmanaged, spilled, memory_limit)}``."""
        if self._t0 is None:
            self._t0 = now
        sample = (round(now - self._t0, 3), _peak(readings), {k: tuple(int(x or 0) for x in v[:4]) for k, v in readings.items()})
        self._latest = sample
        if self._window is None or sample[1] > self._window[1]:
            self._window = sample
        self._seen += 1
        if self._seen < self.stride:
            return
        self.rows.append(self._window)
        self._window, self._seen = None, 0
        limit = max(8, min(self.limit, self.max_readings // max(1, len(readings))))  # samples x workers bounded too
        if len(self.rows) >= limit - 2:  # room left for the unfinished window's largest and the latest
            keep = thin_indices([r[1] for r in self.rows], max(3, (limit - 2) // 2))
            self.rows = [self.rows[i] for i in keep]
            self.stride *= 2

    def data(self) -> dict[str, Any]:
        """Plain JSON data (what ``stats["worker_memory"]["timeline"]`` and the dashboard's JSON hold):
        ``{"t": [...], "pause", "spill", "workers": {name: {"limit", "managed": [...], "unmanaged", "spilled"}}}``."""
        rows = list(self.rows)
        for extra in (self._window, self._latest):  # a window not finished yet: its largest, and the latest
            if extra is not None and (not rows or extra[0] > rows[-1][0]):
                rows.append(extra)
        workers: dict[str, dict[str, Any]] = {}
        for n, (_, _, readings) in enumerate(rows):
            for name, r in readings.items():
                w = workers.get(name)
                if w is None:
                    w = workers[name] = {"limit": None, **{f: [None] * len(rows) for f in _FIELDS}}
                w["limit"] = r[3] or None
                for f, v in zip(_FIELDS, r[:3]):
                    w[f][n] = v
        return {"t": [r[0] for r in rows], "pause": self.pause, "spill": self.spill, "workers": workers}


def totals(data: Any) -> list[tuple[float, int, int]]:
    """The whole cluster's memory over time from the per-worker samples (:meth:`MemoryTimeline.data`):
    ``[(seconds since the first sample, process bytes, spilled bytes), ...]``, a worker's process
    memory being its managed plus unmanaged bytes; a sample no worker has a reading in is left
    out. What ``result.stats["memory_timeline"]`` holds for a budgeted run (the same samples as
    the per-worker charts: one sampler).

    >>> totals({"t": [10.0, 10.5, 11.0], "workers": {
    ...     "a": {"managed": [100, 200, None], "unmanaged": [50, 50, None], "spilled": [0, 10, None]},
    ...     "b": {"managed": [0, 300, None], "unmanaged": [40, 40, None], "spilled": [0, 0, None]}}})
    [(0.0, 190, 0), (0.5, 590, 10)]
    >>> totals(None)
    []
    """
    if not isinstance(data, Mapping) or not data.get("t"):
        return []
    times, workers = data["t"], list((data.get("workers") or {}).values())
    out: list[tuple[float, int, int]] = []
    for i, t in enumerate(times):
        process = spilled = 0
        seen = False
        for w in workers:
            managed, unmanaged, spill = (w.get(f, [None] * len(times))[i] for f in _FIELDS)
            if managed is None and unmanaged is None:
                continue
            seen = True
            process += int(managed or 0) + int(unmanaged or 0)
            spilled += int(spill or 0)
        if seen:
            out.append((round(float(t) - float(times[0]), 3), process, spilled))
    return out


def predicted_worker_peak(predicted_peak: Any, workers: Any) -> int | None:
    """A worker's share of a memory plan's predicted peak (``MemoryPlan.predicted_peak`` over
    ``MemoryPlan.workers``: the plan models every worker holding up to its own share); ``None``
    without a plan.

    >>> predicted_worker_peak(1200, 2), predicted_worker_peak(None, 2)
    (600, None)
    """
    if not isinstance(predicted_peak, numbers.Real) or not isinstance(workers, numbers.Integral) or workers < 1:
        return None
    return int(predicted_peak) // int(workers)


def _fraction(f: Any, limit: Any) -> float | None:
    if isinstance(f, bool) or not isinstance(f, numbers.Real) or not isinstance(limit, numbers.Real) or not limit:
        return None
    return float(f) * float(limit)


#: a worker's limit and pause line are drawn in view once its memory reaches this share of its
#: limit; below it the chart zooms on the data (a 12 GiB limit would flatten 100 MiB to a line)
IN_VIEW = 0.25


def _y_max(row: dict) -> float:
    """The top of a worker's chart: its memory (and the plan's line) with 5% room, and its limit
    and pause line once its memory reaches ``IN_VIEW`` of the limit."""
    values = [m + u for m, u in zip(row["managed"], row["unmanaged"]) if m == m and u == u]
    values += [v for v in row["spilled"] if v == v] + row["predicted"]
    high = max(values, default=0.0)
    lines = [v for v in (row["limit"], row["pause"]) if v]
    if lines and high >= IN_VIEW * max(lines):
        high = max([high] + lines)
    return max(high, 1.0) * 1.05


def worker_series(data: Any, predicted_peak: int | None = None) -> list[dict[str, Any]]:
    """What a memory chart draws, one entry per worker (sorted by name): ``t``, ``managed``,
    ``unmanaged`` (stacked on managed), ``spilled`` (bytes; ``NaN`` in gaps), the worker's
    ``limit``, Dask's ``pause`` and ``spill`` lines (bytes) and the plan's ``predicted`` peak per
    worker (``[bytes]`` or ``[]``). Empty for missing or malformed data.

    >>> s = worker_series({"t": [0, 1], "pause": 0.8, "workers": {"w": {"limit": 100, "managed": [1, None],
    ...     "unmanaged": [2, None], "spilled": [0, None]}}})
    >>> s[0]["name"], s[0]["managed"][0], math.isnan(s[0]["managed"][1]), s[0]["pause"], s[0]["predicted"]
    ('w', 1.0, True, 80.0, [])
    >>> round(s[0]["y_max"], 2)  # 3 of 100: zoomed on the data
    3.15
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("t"), (list, tuple)):
        return []
    t = [float(x) for x in data["t"]]
    out = []
    for name in sorted((data.get("workers") or {})):
        w = data["workers"][name]
        if not isinstance(w, Mapping):
            continue
        row: dict[str, Any] = {"name": name, "t": t}
        for f in _FIELDS:
            values = list(w.get(f) or ())
            if len(values) != len(t):
                break
            row[f] = [float(v) if isinstance(v, numbers.Real) else math.nan for v in values]
        else:
            limit = w.get("limit")
            row["limit"] = float(limit) if isinstance(limit, numbers.Real) and limit else None
            row["pause"] = _fraction(data.get("pause"), limit)
            row["spill"] = _fraction(data.get("spill"), limit)
            row["predicted"] = [float(predicted_peak)] if isinstance(predicted_peak, numbers.Real) else []
            row["y_max"] = _y_max(row)
            out.append(row)
    return out
