"""The result of running an exploration.

>>> r = Result(table=None, value=3, values=[3], stats={"executed_tasks": 2})
>>> r.value, r.stats["executed_tasks"]
(3, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Result"]


@dataclass
class Result:
    """``table``: a pandas DataFrame, one row per branch (choices, parameters, metrics,
    ``status``, ``seconds``, ``chosen``, ``error``, ``failed_step``, ``traceback``).
    ``value``: the chosen branch's output when at most one branch can be kept, else a
    list of the kept outputs, best first.  ``values``: always that list.
    ``stats``: ``naive_tasks``, ``unique_tasks``, ``executed_tasks``,
    ``peak_memory_bytes``, ``spilled_bytes`` and more.
    """

    table: Any
    value: Any
    values: list
    stats: dict = field(default_factory=dict)
    compiled: Any = field(default=None, repr=False)
    #: the ``graph.memory.plan.MemoryPlan`` the run followed (runs with a ``memory_budget``)
    memory_plan: Any = field(default=None, repr=False)
    #: the client a value holding persisted Dask collections lives on (``None`` otherwise)
    client: Any = field(default=None, repr=False)
    _close: Any = field(default=None, repr=False)

    def compute_value(self) -> Any:
        """``value`` with its Dask collections computed (pandas/numpy) and gathered here;
        ``value`` itself when it holds none. Needs the cluster the run used (still open).

        >>> Result(table=None, value=3, values=[3]).compute_value()
        3
        """
        from graph.compiling.collections import compute_value

        return compute_value(self.client, self.value)

    def close(self) -> None:
        """Release persisted collections and close the embedded cluster kept for them."""
        if self._close is not None:
            close, self._close = self._close, None
            close()

    def __enter__(self) -> "Result":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def history(self) -> list | None:
        """Per row of ``table``, the reports its iterative steps made (a list of dicts of
        their scalar entries, in iteration order), or ``None`` when no step of the run is
        iterative (docs/architecture.md §7).  ``table["iterations"]`` is each list's length."""
        attrs = getattr(self.table, "attrs", None)
        return None if attrs is None else attrs.get("history")

    @property
    def rungs(self) -> list:
        """Pruning chooses' rung decisions, in arrival order per rung: dicts with ``choose``,
        ``group`` (the ``per=`` group), ``rung``, ``iteration``, ``input`` (the branch's index
        among the choose's inputs), ``metric``, ``continued`` and ``n`` (branches at that rung
        when it arrived); an empty list when nothing reached a rung (no pruning choose, or
        nothing pruned before its first rung), so ``len(result.rungs)`` and loops always work.

        >>> Result(table=None, value=3, values=[3]).rungs
        []
        """
        attrs = getattr(self.table, "attrs", None)
        rungs = None if attrs is None else attrs.get("rungs")
        return [] if rungs is None else rungs

    @property
    def chosen(self):
        """The rows of ``table`` that were kept."""
        return self.table[self.table["chosen"]]

    def plot(self, path, *, title: str | None = None) -> dict:
        """Write PNG figures and a self-contained HTML report to ``path`` (a directory, or a ``.html`` file).

        The metric of every branch grouped by each explore's alternatives (the chosen branch
        highlighted), the training curves of the chosen run(s) when they have a ``history``,
        and memory over time per worker when ``stats["worker_memory"]`` exists. Returns the paths
        written, e.g. ``{"metrics": .../metrics.png, "html": .../report.html}``; see
        :mod:`pipelines.report`.

        >>> result.plot("report/")                      # doctest: +SKIP
        """
        from .report import write_report

        return write_report(self, path, title=title)

    def _repr_html_(self) -> str:
        """Jupyter's view: the chosen path, key stats, the dashboard link, the table (see
        :mod:`pipelines.notebook`)."""
        from .notebook import result_html

        return result_html(self)

    @property
    def dashboard_link(self) -> str | None:
        """Quiver's exploration page on the dashboard of the cluster, while it is still up."""
        from .notebook import dashboard_link

        return dashboard_link(self)

    def __repr__(self) -> str:
        s = self.stats
        n = len(self.table) if self.table is not None else 0
        return (
            f"<Result {n} branches, {s.get('executed_tasks')} tasks executed of "
            f"{s.get('unique_tasks')} unique ({s.get('naive_tasks')} naive)>"
        )
