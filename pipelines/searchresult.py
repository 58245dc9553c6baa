"""The result of an adaptive search (issue 47): one row per trial, the study, the best trial.

>>> r = SearchResult(table=None, value={"score": 1.0}, study=None, best_trial=3, best_params={"m": "svc"})
>>> r.best_trial, r.value["score"]
(3, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SearchResult"]


@dataclass
class SearchResult:
    """``table``: a pandas DataFrame, one row per trial in proposal order: ``trial`` (the
    study's number), one column per explore (the alternative taken) and per parameter
    (``"<explore>.<param>"``), ``value`` (the metric told), the last step's other scalar
    entries, ``state`` (``COMPLETE``, ``PRUNED``, ``FAIL``), ``error``, ``traceback``,
    ``proposed_at`` / ``told_at`` (seconds from the search's start).
    ``value``: the best trial's output (``None`` when none completed). ``study``: the
    ``optuna.Study`` (the one given, or the one the search made). ``best_trial``/``best_params``:
    this search's best trial (``study.best_trial`` also counts a resumed study's earlier ones).
    ``stats``: ``trials``, ``complete``, ``pruned``, ``failed``, ``naive_tasks``,
    ``unique_tasks``, ``executed_tasks``, ``prefix_tasks_saved``, ``wall_seconds`` and more.
    """

    table: Any
    value: Any
    study: Any
    best_trial: int | None
    best_params: dict | None
    stats: dict = field(default_factory=dict)

    @property
    def values(self) -> list:
        """``[value]`` (or ``[]``): a search keeps one branch, the best."""
        return [] if self.best_trial is None else [self.value]
