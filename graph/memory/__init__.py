"""Memory under a byte budget: size estimates, the plan, the workers' planned spill buffer, the run's budget.

* :mod:`graph.memory.limits`: a worker's share of the budget, Dask's thresholds, the room for results;
* :mod:`graph.memory.sizes`: byte sizes of step results (measured, hinted, a sibling's, a default);
* :mod:`graph.memory.plan`: :func:`plan_memory`, pure: what stays, spills or is recomputed (Belady's
  rule over the run order), as a printable :class:`MemoryPlan`;
* :mod:`graph.memory.interleave`: pure: the order Dask runs a submission's partitions in (across
  sibling branches), which the plan walks;
* :mod:`graph.state.secondpass`: pure: a partition read again after a reduction is computed again
  for that read instead of held across it (when the data do not fit);
* :mod:`graph.memory.spill`: on the workers, Dask's ``SpillBuffer`` evicting by the plan;
* :mod:`graph.memory.budget`: a run under a ``memory_budget`` (limits, baseline, re-planning).
* :mod:`graph.memory.working`: pure rules on what a step holds while it runs (temporaries,
  admission under the pause line, which step a worker restarted for memory is blamed on);
* :mod:`graph.memory.workmeter`: on the workers, each task's working memory measured, tasks admitted by it.
* :mod:`graph.memory.finished`: on the workers, a task that has run forgets its run_spec.

The rules are described in ``docs/architecture.md`` (scheduling and memory). Importing this package
imports nothing heavy: its names load on first use.

>>> from graph.memory import parse_bytes, format_bytes
>>> parse_bytes("2 GiB"), format_bytes(3 * 2**20)
(2147483648, '3.00 MiB')
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BudgetedRun",
    "MemoryPlan",
    "PlannedSpillBuffer",
    "SizeEstimates",
    "Thresholds",
    "dask_thresholds",
    "data_share",
    "format_bytes",
    "parse_bytes",
    "plan_memory",
    "worker_limits",
]

_LAZY = {
    "BudgetedRun": "graph.memory.budget",
    "worker_limits": "graph.memory.limits",
    "Thresholds": "graph.memory.limits",
    "dask_thresholds": "graph.memory.limits",
    "data_share": "graph.memory.limits",
    "MemoryPlan": "graph.memory.plan",
    "plan_memory": "graph.memory.plan",
    "PlannedSpillBuffer": "graph.memory.spill",
    "SizeEstimates": "graph.memory.sizes",
    "format_bytes": "graph.memory.sizes",
    "parse_bytes": "graph.memory.sizes",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graph.memory' has no attribute {name!r}")
