"""Plan-driven spilling on Dask workers: evict the result needed furthest in the future.

A worker keeps results in ``distributed.spill.SpillBuffer`` (a ``zict.Buffer``
whose fast side is a ``zict.LRU``).  When it must make room it evicts the least
recently used key, which in an exploration is often the shared intermediate the
*next* branch needs.  :class:`PlannedLRU` is that same LRU with one change: when
a memory plan is installed it evicts the key whose next planned use is furthest
away (keys with no further use first).  Everything else — the thresholds, the
disk format, the metrics, pausing — is Dask's own.

:class:`PlannedSpillBuffer` is a ``SpillBuffer`` with that eviction, for a
worker's ``data=`` argument (how Quiver starts its embedded cluster).
:class:`MemoryPlanPlugin` installs a run's plan on every worker for the run's
duration; on workers started with a plain ``SpillBuffer`` it switches their LRU
to the planned one in place (and back afterwards).

>>> lru = PlannedLRU(100, {})
>>> for k in "abc":
...     lru[k] = 1
>>> lru.plan = NextUses({"a": (5,), "b": (9,), "c": (7,)})
>>> lru.evict()[0]          # b is needed last
'b'
>>> lru.plan.advance(8)     # at position 8, a and c have been read for the last time
>>> lru.evict()[0]          # (the run releases them in a moment: evicted last)
'a'
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Mapping
from typing import Any

import zict
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.spill import SpillBuffer

from .._dask import lru_evict_unlocked, lru_pinned, turn_lru
from ..keys import original_key

__all__ = [
    "NextUses",
    "PlannedLRU",
    "PlannedSpillBuffer",
    "SharedWeight",
    "MemoryPlanPlugin",
    "spill_metrics",
    "update_plan_on_worker",
]

logger = logging.getLogger("quiver.spill")


class NextUses:
    """Planned read positions per key, and the worker's progress through the plan."""

    def __init__(self, uses: Mapping[str, tuple[int, ...]], positions: Mapping[str, int] | None = None):
        self.uses = {k: tuple(sorted(v)) for k, v in uses.items()}
        self.positions = dict(positions or {})
        self.now = -1

    def advance(self, position: int) -> None:
        self.now = max(self.now, position)

    def started(self, key: str) -> None:
        p = self.positions.get(key)
        if p is not None:
            self.advance(p)

    def rank(self, key: Any) -> float:
        """Larger = evict sooner.  Keys the plan does not know, and results only held in case a
        choose keeps their branch (no planned read), go first; then by next planned read,
        furthest first.  A result read for the last time goes last: the run is about to
        release it, so writing it to disk would be wasted work."""
        key = original_key(key)  # the executor's recompute copy of a key is planned as the key
        u = self.uses.get(key)
        if u is None or not u:
            return math.inf
        i = bisect.bisect_right(u, self.now)
        return u[i] if i < len(u) else -1.0


def evictable(fast: Any) -> list:
    """The keys a worker's in-memory results may be evicted from, least recently used first
    (those a ``zict.LRU`` is not told to keep; not a view of another result, weighed 0 by
    :class:`SharedWeight`: writing it to disk would free nothing)."""
    pinned = lru_pinned(fast)
    weights = fast.weights
    return [k for k in fast.order if k not in pinned and weights.get(k, 1) > 0]


class SharedWeight:
    """A planned worker's weight of a result: ``dask.sizeof``, or 0 while another result it holds
    has the same memory (an alias, a NumPy view: :func:`graph.memory.shared.owned_weight`). When
    the result that carried the weight leaves memory, a remaining holder takes it over
    (:meth:`PlannedLRU.carry_over`), so memory still held is still counted.

    >>> import numpy as np
    >>> lru = PlannedLRU(10**9, {})
    >>> lru.weight = SharedWeight(lru)
    >>> a = np.zeros(1000)
    >>> lru["a"] = a; lru["v"] = a[:600]
    >>> lru.weights["a"], lru.weights["v"], lru.total_weight
    (8000, 0, 8000)
    >>> del lru["a"]
    >>> lru.weights["v"], lru.total_weight      # the view now holds the buffer
    (8000, 8000)
    """

    def __init__(self, lru: Any, original: Any = None):
        self.lru = lru
        self.original = original
        self.roots: dict[int, list] = {}

    def __call__(self, key: Any, value: Any) -> int:
        from .shared import owned_weight

        return owned_weight(key, value, self.lru.d, self.roots)

    def holders(self, key: Any, value: Any) -> list:
        """Other resident keys holding ``value``'s memory."""
        from .shared import root_buffer

        root = root_buffer(value)
        d = self.lru.d
        return [k for k in self.roots.get(id(root), ()) if k != key and k in d and root_buffer(d[k]) is root]


def planned_rank(fast: Any, plan: NextUses) -> Any:
    """The victim rule under a plan (the one owner): the key needed furthest in the future goes
    first, the heavier on a tie; a sort key, largest first."""
    return lambda k: (plan.rank(k), fast.weights.get(k, 0))


class PlannedLRU(zict.LRU):
    """``zict.LRU`` that, with a plan installed, evicts the key needed furthest in the future."""

    plan: NextUses | None = None

    @zict.common.locked
    def evict(self, key: Any = zict.common.nodefault):  # type: ignore[override]
        plan = self.plan
        if key is zict.common.nodefault and plan is not None and not self.heavy:
            candidates = evictable(self)
            if candidates:
                key = max(candidates, key=planned_rank(self, plan))
        # the undecorated LRU.evict: one lock level, which zict releases while writing to disk
        out = lru_evict_unlocked(self, key)
        if out and out[0] is not None:
            self.carry_over(out[0], out[1], out[2])
        return out

    @zict.common.locked
    def __delitem__(self, key: Any) -> None:
        value, weight = self.d.get(key), self.weights.get(key, 0)
        super().__delitem__(key)
        self.carry_over(key, value, weight)

    def carry_over(self, key: Any, value: Any, weight: float) -> None:
        """``key`` (weighing ``weight``) left memory: if another result still holds its memory
        (a view of it, an alias), that one now weighs it (:class:`SharedWeight`)."""
        shared = self.weight if isinstance(self.weight, SharedWeight) else None
        if shared is None or not weight:
            return
        holders = shared.holders(key, value)
        if holders and not self.weights.get(holders[0]):
            self.weights[holders[0]] = weight
            self.total_weight += weight


def _plan_fast(buffer: SpillBuffer) -> PlannedLRU:
    fast = turn_lru(buffer.fast, PlannedLRU)  # same object, same state; only ``evict`` differs
    if not isinstance(fast.weight, SharedWeight):  # views and aliases weigh what they own: nothing
        fast.weight = SharedWeight(fast, fast.weight)
    return fast


class PlannedSpillBuffer(SpillBuffer):
    """A worker's ``SpillBuffer`` whose evictions follow the installed memory plan.

    Use as ``Worker(data=(PlannedSpillBuffer, {"target": nbytes}))``.
    """

    def __init__(self, worker_local_directory: str, target: int, max_spill: int | bool = False):
        import os

        super().__init__(os.path.join(worker_local_directory, "storage"), target=target, max_spill=max_spill)
        _plan_fast(self)


class MemoryPlanPlugin(WorkerPlugin):
    """Install a run's plan (next uses, and optionally a spill target) on each worker.

    Runs may overlap on one cluster: each worker keeps the installed plans by name
    and its original state, uses the newest plan, and gets its original eviction
    and spill target back when the last run ends.
    """

    def __init__(self, name: str, uses: Mapping[str, tuple[int, ...]], positions: Mapping[str, int], target: int | None):
        self.name = name
        self.uses = dict(uses)
        self.positions = dict(positions)
        self.target = target
        self._next: NextUses | None = None

    @staticmethod
    def _state(worker: Any) -> dict:
        state = getattr(worker, "_quiver_memory_plans", None)
        if state is None:
            state = {"original": None, "plans": {}}
            worker._quiver_memory_plans = state
        return state

    @staticmethod
    def _install(worker: Any) -> None:
        state = MemoryPlanPlugin._state(worker)
        fast = _plan_fast(worker.data)
        if state["plans"]:
            plan, target = list(state["plans"].values())[-1]
            fast.plan = plan
            if target is not None:  # Dask spills down to it as new results arrive (no blocking evict here);
                # a budget only tightens the worker's own spill target, never loosens it (issue 50: with a
                # lighter idle worker the plan's share came out above Dask's own target)
                own = state["original"][1] if state["original"] is not None else None
                fast.n = min(target, own) if own else target
        elif state["original"] is not None:
            fast.plan, fast.n = state["original"]
            state["original"] = None

    def setup(self, worker: Any) -> None:
        data = worker.data
        if not isinstance(data, SpillBuffer):
            logger.warning("worker %s does not spill (data is %s); the memory plan only orders work", worker.address, type(data).__name__)
            return
        state = self._state(worker)
        fast = _plan_fast(data)
        if state["original"] is None and not state["plans"]:
            state["original"] = (fast.plan, fast.n)
        self._next = NextUses(self.uses, self.positions)
        state["plans"][self.name] = (self._next, self.target)
        self._install(worker)

    def update(self, worker: Any, uses: Mapping[str, tuple[int, ...]], positions: Mapping[str, int]) -> None:
        """A re-plan (after a choose decided): new planned uses; the clock is kept."""
        if self._next is not None:
            self._next.uses = {k: tuple(sorted(v)) for k, v in uses.items()}
            self._next.positions = dict(positions)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if self._next is not None and finish == "executing":
            self._next.started(key)

    def teardown(self, worker: Any) -> None:
        if not isinstance(worker.data, SpillBuffer):
            return
        self._state(worker)["plans"].pop(self.name, None)
        self._install(worker)
        self._next = None


def update_plan_on_worker(dask_worker: Any, name: str, uses: Mapping, positions: Mapping) -> bool:
    """``client.run(update_plan_on_worker, name=..., uses=..., positions=...)``."""
    plugin = dask_worker.plugins.get(name)
    if plugin is None:
        return False
    plugin.update(dask_worker, uses, positions)
    return True


def spill_metrics(dask_worker: Any) -> dict[str, float]:
    """A worker's cumulative spill counters (``client.run(spill_metrics)``): bytes and
    counts written to and read from disk."""
    data = dask_worker.data
    m = getattr(data, "cumulative_metrics", None)
    if m is None:
        return {}
    out = {
        "write_bytes": m.get(("disk-write", "bytes"), 0.0),
        "write_count": m.get(("disk-write", "count"), 0.0),
        "read_bytes": m.get(("disk-read", "bytes"), 0.0),
        "read_count": m.get(("disk-read", "count"), 0.0),
        "monitor_write_bytes": 0.0,
    }
    # why Dask wrote: its own metrics label each write by what did it; "memory-monitor" is its
    # process-memory trigger (past the spill threshold), not the results' target the plan sets
    for name, v in getattr(dask_worker, "digests_total", {}).items():
        if isinstance(name, tuple) and len(name) >= 3 and name[0] == "memory-monitor" and name[-2:] == ("disk-write", "bytes"):
            out["monitor_write_bytes"] += v
    return out
