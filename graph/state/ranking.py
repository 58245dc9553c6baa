"""Pure choose logic: which branches of one group a choose keeps.

Ranking is by the metric (higher first for ``mode="max"``, lower first for
``"min"``); ties go to the branch declared first (lower input index).  A NaN
metric ranks after every number and never reaches a threshold.

>>> decide({0: 0.5, 1: 0.9, 2: 0.9}, order=[2, 1, 0], pending=[], mode="max", k=None, threshold=None)
ChooseOutcome(keep=[1], drop=[2, 0], cancel=[], final=True)
>>> decide({0: 0.5, 1: 0.9}, order=[1, 0], pending=[2, 3], mode="max", k=1, threshold=0.8)
ChooseOutcome(keep=[1], drop=[0], cancel=[2, 3], final=True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ChooseOutcome", "best", "best_so_far", "decide", "rank", "meets", "sort_key"]


@dataclass
class ChooseOutcome:
    """Input indices to keep (best first), to drop (resolved, not kept) and to cancel (unfinished)."""

    keep: list[int]
    drop: list[int]
    cancel: list[int]
    final: bool


def sort_key(metric: float, index: int, mode: str) -> tuple:
    if math.isnan(metric):
        return (1, 0.0, index)
    return (0, -metric if mode == "max" else metric, index)


def rank(metrics: Mapping[int, float], mode: str) -> list[int]:
    """Indices ordered best first (NaN last, ties by index)."""
    return sorted(metrics, key=lambda i: sort_key(metrics[i], i, mode))


def best_so_far(current: tuple[float, int] | None, metric: float | None, index: int, mode: str) -> tuple[float, int] | None:
    """``(metric, index)`` of the better of ``current`` (``None``: nothing yet) and a new
    ``metric`` of branch ``index``; a missing or NaN metric never wins. The one rule for
    "best so far" (the run's progress line one result at a time, :func:`best` over many).

    >>> best_so_far(None, 0.5, 3, "max"), best_so_far((0.9, 1), 0.9, 0, "max"), best_so_far((0.9, 1), float("nan"), 0, "min")
    ((0.5, 3), (0.9, 0), (0.9, 1))
    """
    if metric is None or metric != metric:
        return current
    if current is None or sort_key(metric, index, mode) < sort_key(current[0], current[1], mode):
        return (metric, index)
    return current


def best(metrics: Mapping[int, float], mode: str) -> int | None:
    """The index of the best numeric metric (ties: the lower index), ``None`` if none is a number
    (:func:`best_so_far` over ``metrics``; the dashboard's "best").

    >>> best({3: 0.5, 1: 0.9, 2: 0.9, 0: float("nan")}, "max"), best({0: float("nan")}, "min")
    (1, None)
    """
    pick = None
    for i, m in metrics.items():
        pick = best_so_far(pick, m, i, mode)
    return None if pick is None else pick[1]


def meets(metric: float, threshold: float, mode: str) -> bool:
    if math.isnan(metric):
        return False
    return metric >= threshold if mode == "max" else metric <= threshold


def decide(
    metrics: Mapping[int, float],
    order: Sequence[int],
    pending: Sequence[int],
    mode: str,
    k: int | None,
    threshold: float | None,
) -> ChooseOutcome | None:
    """Decide one group of a choose, or return ``None`` if it must wait for more results.

    ``metrics`` holds the metric of every finished branch (failed ones are absent),
    ``order`` their completion order, ``pending`` the branches still running.
    """
    if k is not None and threshold is not None:
        reached = [i for i in order if i in metrics and meets(metrics[i], threshold, mode)]
        if len(reached) >= k or not pending:
            keep = reached[:k]
            kept = set(keep)
            drop = [i for i in order if i in metrics and i not in kept]
            return ChooseOutcome(keep, drop, list(pending), True)
        return None
    if pending:
        return None
    ranked = rank(metrics, mode)
    if threshold is not None:
        keep = [i for i in ranked if meets(metrics[i], threshold, mode)]
    else:
        keep = [i for i in ranked if not math.isnan(metrics[i])][: 1 if k is None else k]
    kept = set(keep)
    return ChooseOutcome(keep, [i for i in ranked if i not in kept], [], True)
