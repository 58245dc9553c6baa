"""One branch's final state, as the state machine reports it: a row of ``Result.table``.

The machine (:meth:`graph.state.machine.ExplorationState.rows`) fills these; ``graph.report.table``
turns them into the pandas table. Pure data: no pandas, no cluster.

>>> from graph.compiling.compiler import Branch
>>> row = RowState(Branch(choice_items=(), key="k", lineage=()), status="ok", chosen=True, metrics=[(0, 0.9)])
>>> row.status, row.history, row.pruned_at
('ok', [], None)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RowState"]


@dataclass
class RowState:
    branch: Any  # its graph.compiling.compiler.Branch
    status: str
    chosen: bool
    metrics: list  # [(choose index, metric or None)]
    error: str | None = None
    traceback: str | None = None
    failed_step: str | None = None
    has_value: bool = False
    scalars: dict = field(default_factory=dict)
    iterations: int | None = None  # reports its iterative steps made (None: the run has no iterative step)
    history: list = field(default_factory=list)  # those reports (dicts of their scalar entries)
    pruned_at: int | None = None  # the iteration a pruning choose stopped it at
