"""Build ``Result.table`` (one row per branch) and the kept values, best first.

Columns: one per explore name (the alternative's label), one per parameter
(``"<explore>.<param>"``), the choose metric columns, then scalar entries of the
branch's final output when it is a mapping, then (when the run has an iterative step) ``iterations``,
(when a step was retried after an infrastructure error) ``retries``, then ``status``, ``seconds``,
``chosen``, ``error``, ``error_kind`` (``graph.state.failures``: ``step``, ``infrastructure`` or
``serialisation``), ``failed_step`` and ``traceback``.

``iterations``: the reports the branch's iterative steps made (docs/architecture.md §7): for a
pruned branch, the iteration it was stopped at; 0 for a branch with no iterative step, or whose
iterative step's value came from the result store.  The column is absent when no step of the
run is iterative.  ``table.attrs["history"]`` (``Result.history``) lists each row's reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..compiling.compiler import CompiledPipeline, scalar_entries
from ..spec import fn_name
from ..state.failures import failure_kind
from ..state.ranking import sort_key
from ..state.rows import RowState

__all__ = ["History", "branch_seconds", "build_table", "import_table_library"]


def branch_seconds(lineages: list, seconds: Mapping[str, float]) -> list[float]:
    """Each branch's ``seconds``: the compute of the tasks on its path (``seconds``: per task,
    as :class:`graph.run.monitor.RunMonitor` measured it, an iterative step's waits at rungs left
    out), a task that ``n`` branches share counting ``1/n`` in each.  The column therefore sums
    to the compute the run spent on its branches, never more than worker threads x wall time.

    >>> branch_seconds([("load", "fit-a"), ("load", "fit-b")], {"load": 2.0, "fit-a": 1.0, "fit-b": 3.0})
    [2.0, 4.0]
    """
    sharing: dict[str, int] = {}
    for lineage in lineages:
        for k in set(lineage):
            sharing[k] = sharing.get(k, 0) + 1
    return [sum(seconds.get(k, 0.0) / sharing[k] for k in set(lineage)) for lineage in lineages]


class History(list):
    """``table.attrs["history"]`` (``Result.history``): per row, its reports.  A record of the
    run, shared rather than copied: pandas deep-copies a table's ``attrs`` on every operation
    (a column, a filter), which for a long run's history took seconds each.

    >>> import copy
    >>> h = History([[{"accuracy": 0.5}]])
    >>> copy.deepcopy(h) is h
    True
    """

    def __deepcopy__(self, memo: dict) -> "History":
        return self


def import_table_library() -> None:
    """Import what :func:`build_table` needs (pandas, 0.3-0.4 s in a fresh process) now: a
    process that starts an embedded cluster does it while the workers' prepared process
    imports theirs (graph/cluster/workerstart.py), instead of after the run's last task."""
    import pandas  # noqa: F401


def build_table(
    compiled: CompiledPipeline,
    rows: list[RowState],
    values: dict[str, Any],
    seconds: dict[str, float],
    retries: dict[str, int] | None = None,
) -> tuple[Any, list]:
    """Return ``(table, kept values best first)``. ``retries``: infrastructure retries per task
    key (``graph.parcels``); a ``retries`` column counts those of each branch's steps when any."""
    import pandas as pd  # only here: the rows themselves are imported where pandas is not needed

    names = compiled.explore_names
    param_cols: dict[str, None] = {}
    for r in rows:
        for name, _, params in r.branch.choice_items:
            for p, _ in params:
                param_cols.setdefault(f"{name}.{p}", None)
    metric_cols: dict[str, None] = {}
    for cp in compiled.chooses:
        metric_cols.setdefault(cp.spec.metric_name, None)

    share = branch_seconds([r.branch.lineage for r in rows], seconds)
    records = []
    for r, spent in zip(rows, share):
        rec: dict[str, Any] = {n: None for n in names}
        rec.update({c: None for c in param_cols})
        for name, label, params in r.branch.choice_items:
            rec[name] = label
            for p, v in params:
                rec[f"{name}.{p}"] = fn_name(v) if callable(v) else v  # a model factory shows as its name
        for ci, m in r.metrics:
            rec[compiled.chooses[ci].spec.metric_name] = m
        value = values.get(r.branch.key) if r.has_value else None
        entries = dict(r.scalars)
        entries.update(scalar_entries(value))
        for k, v in entries.items():
            if k not in rec:
                rec[k] = v
        if r.has_value and not isinstance(value, Mapping) and "value" not in rec:
            rec.update(scalar_entries({"value": value}))  # a scalar output gets a "value" column
        if r.iterations is not None:
            rec["iterations"] = r.iterations
        rec["status"] = r.status
        rec["seconds"] = spent
        rec["chosen"] = r.chosen
        rec["error"] = r.error
        rec["error_kind"] = failure_kind(r.error)
        rec["failed_step"] = r.failed_step
        if retries:
            rec["retries"] = sum(retries.get(k, 0) for k in r.branch.lineage)
        rec["traceback"] = r.traceback
        records.append(rec)
    fixed = list(names) + list(param_cols) + list(metric_cols)
    tail = ["status", "seconds", "chosen", "error", "error_kind", "failed_step", "traceback"]
    if any(r.iterations is not None for r in rows):
        tail.insert(0, "iterations")
    if retries:
        tail.insert(tail.index("status"), "retries")
    extra: dict[str, None] = {}
    for rec in records:
        for k in rec:
            if k not in fixed and k not in tail:
                extra.setdefault(k, None)
    columns = fixed + list(extra) + tail
    table = pd.DataFrame.from_records(records, columns=columns)
    table.index.name = "branch"

    def order(i: int) -> tuple:
        r = rows[i]
        if not r.metrics:
            return (i,)
        ci, m = r.metrics[-1]
        return sort_key(float("nan") if m is None else m, i, compiled.chooses[ci].spec.mode)

    kept_rows = sorted((i for i, r in enumerate(rows) if r.chosen and r.has_value), key=order)
    kept = [values[rows[i].branch.key] for i in kept_rows]
    table.attrs["kept_branches"] = list(kept_rows)  # the rows of ``kept``, in its order (best first)
    if any(r.iterations is not None for r in rows):
        table.attrs["history"] = History(list(r.history) for r in rows)  # Result.history: per row, its reports
    return table, kept
