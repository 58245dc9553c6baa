"""Keep, spill or recompute a result under memory pressure: the one rule, by what each costs.

The memory plan (:mod:`graph.memory.plan`) holds every result from creation to last use while
its worker's share can hold it. When it cannot, the result needed furthest in the future leaves
memory, and this rule says how:

* **spill**: written to disk now and read back for each later read that happens, ``bytes /
  disk bandwidth`` each way (the bandwidth measured on a worker when the plan first evicts);
* **recompute**: dropped, and computed again for its next read: the measured compute seconds of
  the lineage that would run again (the result and whatever it needs that is no longer in memory
  or on disk; per key once measured, else the largest measured instance of its layer or step).

Whichever costs less wins; on a tie, or when a lineage's cost is unknown, the result is spilled
(spilling never runs a step twice). ``reads`` is how likely the later read is (a branch an
undecided choose may drop: the chance it keeps it). A result is never taken out of memory by
this rule while the budget holds it: :func:`decide` answers ``keep`` whenever ``fits``.

>>> decide(nbytes=100 * 2**20, recompute_seconds=0.02, disk_bandwidth=300e6)   # a seeded chunk
'recompute'
>>> decide(nbytes=100 * 2**20, recompute_seconds=30.0, disk_bandwidth=300e6)   # a model's scores
'spill'
>>> decide(nbytes=100 * 2**20, recompute_seconds=0.02, disk_bandwidth=300e6, fits=True)
'keep'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KEEP", "SPILL", "RECOMPUTE", "Costs", "costs", "decide"]

KEEP, SPILL, RECOMPUTE = "keep", "spill", "recompute"


@dataclass(frozen=True)
class Costs:
    """Seconds each way of taking a result out of memory costs (``inf``: unknown)."""

    spill: float
    recompute: float

    @property
    def cheaper(self) -> str:
        """``recompute`` only when strictly cheaper and known; else ``spill``."""
        return RECOMPUTE if self.recompute < self.spill else SPILL


def costs(nbytes: int, recompute_seconds: float, disk_bandwidth: float, reads: float = 1.0) -> Costs:
    """Spilling costs a write now and ``reads`` read-backs; recomputing costs ``reads`` times the
    lineage's seconds.

    >>> c = costs(300_000_000, 0.5, 300e6)
    >>> c.spill, c.recompute, c.cheaper
    (2.0, 0.5, 'recompute')
    >>> costs(300_000_000, math.inf, 300e6).cheaper
    'spill'
    """
    if disk_bandwidth <= 0:
        raise ValueError(f"disk bandwidth must be positive, got {disk_bandwidth!r}")
    reads = min(max(float(reads), 0.0), 1.0)
    move = nbytes / disk_bandwidth
    recompute = reads * recompute_seconds if recompute_seconds != math.inf else math.inf
    return Costs(spill=move * (1.0 + reads), recompute=recompute)


def decide(nbytes: int, recompute_seconds: float, disk_bandwidth: float, *, reads: float = 1.0,
           fits: bool = False) -> str:
    """``keep`` when the budget holds it (``fits``), else the cheaper of ``spill`` and ``recompute``."""
    if fits:
        return KEEP
    return costs(nbytes, recompute_seconds, disk_bandwidth, reads).cheaper
