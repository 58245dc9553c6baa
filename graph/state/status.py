"""Branch statuses: their names, the rule that gives a branch its status, what the dashboard and
the report show for it, and their colours. The one owner of each (docs/architecture.md §4);
pure code, no cluster, no pandas.

Final statuses (``result.table["status"]``, ``--json``): ``ok`` (everything ran), ``failed``,
``dropped`` (a choose did not keep it: it lost a ``choose``), ``pruned`` (a pruning choose such
as ``halving`` stopped its iterative step mid-training) and ``cancelled`` (a first-k-above-threshold
choose cancelled it, or the run was stopped before it resolved). While a run goes: ``waiting``,
``running``, ``done`` (its metric is in, the choose has not decided). The dashboard and the report
show ``ok`` as ``chosen`` or ``done`` (:func:`final_status`).

Results made before ``dropped`` existed say ``pruned`` for both kinds of loser; they still load
and show (``pruned`` keeps its name, colour and place).

>>> branch_status(False, ["drop"], ends_at_drop=False, done=False, stopped=False, running=False, metric_in=True, aborted=False)
'dropped'
>>> end_status("running", aborted=False), end_status("running", aborted=True), end_status("ok", aborted=True)
('dropped', 'cancelled', 'ok')
>>> final_status("ok", chosen=True), final_status("ok", chosen=False), final_status("pruned", chosen=False)
('chosen', 'done', 'pruned')
>>> live_status("running", processing=False), stopped_status("waiting"), stopped_status("done")
('waiting', 'cancelled', 'done')
"""

from __future__ import annotations

__all__ = [
    "COLORS",
    "LIVE_STATUSES",
    "STATUSES",
    "TABLE_STATUSES",
    "branch_status",
    "end_status",
    "final_status",
    "live_status",
    "stopped_status",
]

#: the statuses a finished run's table holds
TABLE_STATUSES = ("ok", "failed", "dropped", "pruned", "cancelled")
#: the statuses of a branch that has not resolved yet
LIVE_STATUSES = ("waiting", "running", "done")
#: every status the dashboard shows (``ok`` shows as ``chosen`` or ``done``)
STATUSES = ("waiting", "running", "done", "failed", "dropped", "pruned", "cancelled", "chosen")

#: one colour per shown status (the dashboard's tree and curves, the static report's points)
COLORS = {
    "waiting": "#c7c7c7",
    "running": "#3182bd",
    "done": "#74c476",
    "chosen": "#e6550d",
    "failed": "#252525",
    "dropped": "#bdbdbd",
    "pruned": "#fd8d3c",
    "cancelled": "#9e9ac8",
}


def branch_status(failed: bool, decisions: list, ends_at_drop: bool, done: bool, stopped: bool,
                  running: bool, metric_in: bool, aborted: bool) -> str:
    """The one rule for a branch's status now.

    ``failed`` (a step or metric read of it failed) before ``cancelled`` (a choose cancelled it)
    before ``dropped`` (a choose did not keep it, before its remaining steps ran, even if a store
    or another branch computed them) before ``pruned`` (a pruning choose stopped its step) before
    ``ok`` (everything ran: its value, or its metric at the choose that dropped it, is in: a branch
    that ends at the choose that dropped it ran to its end). Unresolved: ``cancelled`` once the
    run is stopped, else ``running`` (some task of it is submitted), ``done`` (its metric is in,
    the choose has not decided) or ``waiting``.

    >>> branch_status(False, ["drop"], ends_at_drop=True, done=False, stopped=False, running=False, metric_in=True, aborted=False)
    'ok'
    >>> branch_status(False, [None], ends_at_drop=False, done=False, stopped=True, running=False, metric_in=False, aborted=False)
    'pruned'
    """
    if failed:
        return "failed"
    if "cancel" in decisions:
        return "cancelled"
    if "drop" in decisions:
        return "ok" if ends_at_drop else "dropped"
    if stopped:
        return "pruned"
    if done:
        return "ok"
    if aborted:
        return "cancelled"
    if running:
        return "running"
    return "done" if metric_in else "waiting"


def end_status(status: str, aborted: bool) -> str:
    """A branch's table status when its run has ended: one still unresolved was ``cancelled``
    (the run was stopped) or ``dropped`` (the run ended without needing it)."""
    if status in LIVE_STATUSES:
        return "cancelled" if aborted else "dropped"
    return status


def final_status(table_status: str, chosen: bool) -> str:
    """What the dashboard and the report show for a finished branch: ``ok`` as ``chosen`` or
    ``done``, any other status as itself."""
    if table_status == "ok":
        return "chosen" if chosen else "done"
    return table_status


def live_status(status: str, processing: bool) -> str:
    """A ``running`` branch shows as ``running`` only while a task of it is processing on the
    scheduler (``processing``), else ``waiting``."""
    if status == "running" and not processing:
        return "waiting"
    return status


def stopped_status(status: str) -> str:
    """What a branch shows when its run stopped with an error: unfinished (``waiting``,
    ``running``) never will, so ``cancelled``."""
    return "cancelled" if status in ("waiting", "running") else status
