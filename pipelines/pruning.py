"""``halving``: the pruning rule a choose may apply while its iterative inputs run.

>>> from pipelines import halving
>>> halving(factor=3, min_iter=1, max_iter=27)
PruneSpec(factor=3, min_iter=1, max_iter=27)
>>> halving(factor=1)
Traceback (most recent call last):
    ...
graph.errors.PipelineError: halving(factor=1): factor must be a whole number >= 2 (the share of branches kept at each rung is 1/factor), e.g. halving(factor=3).
"""

from __future__ import annotations

import numbers
from typing import Any

from graph.errors import PipelineError
from graph.spec import PruneSpec

__all__ = ["halving"]


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def halving(factor: int = 3, min_iter: int = 1, max_iter: int | None = None) -> PruneSpec:
    """Asynchronous successive halving (docs/architecture.md §7), for ``choose(..., prune=)``.

    Rungs at ``min_iter * factor**r`` reports; a branch reaching a rung continues iff it
    ranks within the top ``max(1, n // factor)`` of the ``n`` branches (of its group) that
    have reached that rung so far (reports that arrive together, as a packed task's members'
    of one epoch, are ranked together), else it is stopped at once (status ``pruned``).  A
    branch that makes ``max_iter`` reports stops there and completes (``None``: no cap).
    """
    where = f"halving(factor={factor!r}, min_iter={min_iter!r}, max_iter={max_iter!r})"
    if not _whole(factor) or factor < 2:
        raise PipelineError(
            f"halving(factor={factor!r}): factor must be a whole number >= 2 (the share of branches "
            "kept at each rung is 1/factor), e.g. halving(factor=3)."
        )
    if not _whole(min_iter) or min_iter < 1:
        raise PipelineError(
            f"{where}: min_iter must be a whole number >= 1 (the reports a branch makes before its "
            "first rung), e.g. halving(min_iter=1)."
        )
    if max_iter is not None and (not _whole(max_iter) or max_iter < min_iter):
        raise PipelineError(
            f"{where}: max_iter must be None (no cap) or a whole number >= min_iter "
            f"({min_iter!r}), the most reports a branch makes, e.g. halving(min_iter=1, max_iter=27)."
        )
    return PruneSpec(int(factor), int(min_iter), None if max_iter is None else int(max_iter))
