"""Pure pruning rule of a choose: asynchronous successive halving (ASHA, docs/architecture.md §7).

A :class:`Halving` is fed branch reports in the order the run receives them (one at a time,
or several that arrived together: :meth:`Halving.report_many`) and answers at once, never
waiting for other branches:

* rungs are at ``min_iter * factor**r`` reports (``PruneSpec.rung_of``), below ``max_iter``;
* a branch that reaches a rung continues iff its metric ranks within the top
  ``max(1, n // factor)`` of the ``n`` branches of its group that have reached that rung so
  far, itself and the reports that arrived with it included (``graph.state.ranking.sort_key``: higher first for ``mode="max"``, lower
  for ``"min"``, ties to the lower branch index, i.e. the branch declared first, NaN last);
  a NaN metric never continues (a choose never keeps a NaN branch either);
* otherwise it stops: ``Stop(rung, iteration)``, a *pruned* branch;
* the report that makes ``max_iter`` reports stops the branch too, not pruned
  (``Stop(None, iteration)``): it has finished and its last report is its value.

Reports are idempotent per ``(branch, iteration)``: a generator that Dask restarts after a
worker died replays its reports, and each replay gets the first answer again without
counting twice at a rung.  After a ``Stop`` a branch's later reports are not ranked (they
can only come from a stop still in flight) and get the same ``Stop``.  A branch that fails
simply stops reporting: nothing ever waits for it.

>>> from graph.spec import PruneSpec
>>> h = Halving(PruneSpec(factor=2, min_iter=1), mode="max")
>>> h.report(0, None, 1, 0.5)          # first at rung 1: top max(1, 1 // 2) = 1 of 1
Continue()
>>> h.report(1, None, 1, 0.4)          # 2 at rung 1, keep top 1: branch 0 has 0.5
Stop(rung=0, iteration=1)
>>> h.report(1, None, 1, 0.4)          # a replay: same answer, not counted again
Stop(rung=0, iteration=1)
>>> h.report(2, None, 1, 0.9), h.report(0, None, 2, 0.7)
(Continue(), Continue())
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from ..spec import PruneSpec
from .ranking import sort_key

__all__ = ["Continue", "Stop", "Decision", "Halving", "Pruned", "RungEntry", "curve_choose"]


@dataclass(frozen=True)
class Pruned:
    """What a stopped iterative step returns (``graph.tasks.iterative.Iterative`` on a ``Stop``):
    the run recognises it (status ``pruned``)."""

    iterations: int
    last: Mapping | None


@dataclass(frozen=True)
class Continue:
    """The branch goes on to its next iteration."""


@dataclass(frozen=True)
class Stop:
    """Stop the branch after ``iteration`` reports: pruned at rung index ``rung``, or
    (``rung is None``) finished because it made ``max_iter`` reports."""

    rung: int | None
    iteration: int

    @property
    def pruned(self) -> bool:
        return self.rung is not None


Decision = Continue | Stop


@dataclass(frozen=True)
class RungEntry:
    """One branch's arrival at one rung: what the dashboard draws and the tests check."""

    branch: int
    metric: float
    continued: bool
    n: int  # branches at this rung (of this group) when it arrived, itself included


@dataclass
class Halving:
    """The ASHA rule of one choose; ``report`` for every report of every branch.

    ``branch`` is the branch's input index in the choose (declaration order: ties go to
    the lower one), ``group`` its ``per=`` group (``None`` without ``per``), ``iteration``
    the number of reports it has made (from 1), ``metric`` the choose metric of this report.
    """

    prune: PruneSpec
    mode: str = "max"
    _rungs: dict[tuple[Hashable, int], list[tuple]] = field(default_factory=dict, repr=False)
    _seen: dict[tuple[int, int], Decision] = field(default_factory=dict, repr=False)
    _stopped: dict[int, Stop] = field(default_factory=dict, repr=False)
    arrivals: dict[tuple[Hashable, int], list[RungEntry]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            raise ValueError(f"Halving: mode must be 'max' or 'min', got {self.mode!r}")

    def report(self, branch: int, group: Hashable, iteration: int, metric: float) -> Decision:
        """Decide on one report (see the module docstring for the rule)."""
        return self.report_many([(branch, group, iteration, metric)])[0]

    def report_many(self, reports: list[tuple[int, Hashable, int, float]]) -> list[Decision]:
        """Decide on reports that arrived together (``(branch, group, iteration, metric)`` each;
        one decision each, in order): those that reach a rung are ranked *together*, each
        against every branch at its rung so far, the others of the batch included. A packed
        task sends its members' reports of one epoch at once: ranked one after another, the
        first of them would be measured against fewer branches than the last, by the
        arbitrary order within the batch.

        >>> from graph.spec import PruneSpec
        >>> h = Halving(PruneSpec(factor=2, min_iter=1), mode="max")
        >>> h.report_many([(0, None, 1, 0.4), (1, None, 1, 0.5)])  # 2 at rung 1 together: top 1
        [Stop(rung=0, iteration=1), Continue()]
        >>> Halving(PruneSpec(factor=2, min_iter=1)).report(0, None, 1, 0.4)  # alone, it would go on
        Continue()
        """
        decisions: list[Decision | None] = [None] * len(reports)
        fresh: list[tuple[int, int, Hashable, int, float, int | None]] = []  # (position, branch, group, iteration, metric, rung)
        later: list[int] = []  # a branch's second report in the batch: after its first is decided
        heads: set[int] = set()
        for pos, (branch, group, iteration, metric) in enumerate(reports):
            if (branch, iteration) in self._seen:
                continue  # a replay: its first answer, below
            if branch in heads:
                later.append(pos)
                continue
            heads.add(branch)
            if branch in self._stopped:  # its later reports can only come from a stop in flight
                decisions[pos] = self._seen[(branch, iteration)] = self._stopped[branch]
                continue
            metric = float(metric)
            r = self.prune.rung_of(iteration)
            if r is not None:  # every arrival first, then each decision
                bisect.insort(self._rungs.setdefault((group, r), []), sort_key(metric, branch, self.mode))
            fresh.append((pos, branch, group, iteration, metric, r))
        for pos, branch, group, iteration, metric, r in fresh:
            decisions[pos] = self._decide(branch, group, iteration, metric, r)
            self._seen[(branch, iteration)] = decisions[pos]
            if isinstance(decisions[pos], Stop):
                self._stopped.setdefault(branch, decisions[pos])
        for pos in later:
            decisions[pos] = self.report_many([reports[pos]])[0]
        for pos, (branch, _g, iteration, _m) in enumerate(reports):  # replays: the first answer again
            if decisions[pos] is None:
                decisions[pos] = self._seen[(branch, iteration)]
        return decisions  # type: ignore[return-value]

    def _decide(self, branch: int, group: Hashable, iteration: int, metric: float, r: int | None) -> Decision:
        if r is not None:
            ranked = self._rungs[(group, r)]
            n = len(ranked)
            top = max(1, n // self.prune.factor)
            ok = ranked.index(sort_key(metric, branch, self.mode)) < top and not math.isnan(metric)
            self.arrivals.setdefault((group, r), []).append(RungEntry(branch, metric, ok, n))
            if not ok:
                return Stop(r, iteration)
        if self.prune.ends(iteration):
            return Stop(None, iteration)
        return Continue()

    def stopped(self, branch: int) -> Stop | None:
        """The ``Stop`` a branch got, if any."""
        return self._stopped.get(branch)


def curve_choose(chooses) -> int | None:
    """The choose whose metric a run's report curves show (the dashboard's rungs view): the
    first pruning choose (its rungs are the ones drawn), else the last choose (the one the
    dashboard's "best" reads), else ``None`` (no metric to draw).  ``chooses``: the compiled
    ``ChoosePoint`` list (``.index``, ``.spec.prune``).

    >>> from types import SimpleNamespace as NS
    >>> plain, pruning = NS(index=0, spec=NS(prune=None)), NS(index=1, spec=NS(prune=PruneSpec()))
    >>> curve_choose([plain, pruning]), curve_choose([plain]), curve_choose([])
    (1, 0, None)
    """
    chooses = list(chooses)
    first = next((cp.index for cp in chooses if cp.spec.prune is not None), None)
    if first is not None:
        return first
    return chooses[-1].index if chooses else None
