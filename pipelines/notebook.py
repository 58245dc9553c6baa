"""A :class:`~pipelines.Result` as HTML in Jupyter: the chosen path, the key stats, the table.

Jupyter calls ``Result._repr_html_``, which calls :func:`result_html`; a terminal keeps the
plain ``repr``.  Nothing here imports Jupyter, Dask or matplotlib.

>>> import pandas as pd
>>> from pipelines.result import Result
>>> t = pd.DataFrame({"model": ["a", "b"], "model.C": [1.0, 10.0], "acc": [0.5, 0.9],
...                   "status": ["dropped", "ok"], "seconds": [0.1, 0.2], "chosen": [False, True]})
>>> html = result_html(Result(table=t, value=None, values=[], stats={"executed_tasks": 3, "unique_tasks": 4}))
>>> "model=b(C=10.0)" in html and "3 executed of 4 unique" in html
True
"""

from __future__ import annotations

import logging

import html
import numbers
import sys
from typing import Any

__all__ = ["result_html", "dashboard_link", "MAX_ROWS"]

logger = logging.getLogger(__name__)

#: rows of the table shown inline (best first); the whole table is ``result.table``
MAX_ROWS = 20

_HIDDEN = ("traceback",)


def dashboard_link(result) -> str | None:
    """Quiver's exploration page on the dashboard of a cluster that is still up, else ``None``.

    The cluster is the one the result's values live on (persisted collections), else the
    current default ``distributed.Client`` (the one ``node.run(client)`` was given, in a
    notebook). An embedded cluster is closed when the run ends, so its result has no link.
    """
    clients = [getattr(result, "client", None)]
    if "distributed" in sys.modules:  # never import Dask just to look for a client
        try:
            from distributed import default_client

            clients.append(default_client())
        except (ValueError, ImportError):  # no client in this process
            pass
    for client in clients:
        try:
            if client is None or client.status != "running":
                continue
            link = client.dashboard_link
        except Exception as exc:  # a client half closed, or a scheduler without a dashboard: no link from it
            logger.debug("no dashboard link from %r: %s", client, exc)
            continue
        if link:
            return link.rsplit("/", 1)[0] + "/quiver-exploration"
    return None


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _bytes(n: Any) -> str:
    if not isinstance(n, numbers.Real) or n <= 0:
        return "0 MiB"
    return f"{n / 2**20:,.0f} MiB"


def _chosen(result, table, metric: str | None) -> str:
    from .report import _alternative_label, _explores

    if table is None or "chosen" not in table or not table["chosen"].any():
        return "<p>No branch was kept.</p>"
    explores = [e for e in _explores(result) if e in table.columns]
    items = []
    for i, row in table[table["chosen"].astype(bool)].iterrows():
        path = " &rarr; ".join(html.escape(f"{e}={_alternative_label(row, e, table.columns)}") for e in explores)
        score = f" &nbsp; <b>{html.escape(metric)} = {html.escape(_fmt(row.get(metric)))}</b>" if metric in row else ""
        items.append(f"<li>branch {i}: {path or 'the only branch'}{score}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _stats(stats: dict) -> str:
    parts = []
    if "executed_tasks" in stats:
        parts.append(f"tasks: {stats.get('executed_tasks')} executed of {stats.get('unique_tasks')} unique"
                     + (f" ({stats['naive_tasks']} if every branch ran alone)" if "naive_tasks" in stats else ""))
    if "wall_seconds" in stats:
        parts.append(f"{stats['wall_seconds']:.1f} s")
    if "peak_memory_bytes" in stats:
        parts.append(f"peak memory {_bytes(stats['peak_memory_bytes'])}")
    if stats.get("spilled_bytes"):
        parts.append(f"spilled {_bytes(stats['spilled_bytes'])}")
    if stats.get("pruned_branches"):
        parts.append(f"{stats['pruned_branches']} pruned while running")
    if stats.get("loaded_from_store"):
        parts.append(f"{stats['loaded_from_store']} loaded from the store")
    return " &middot; ".join(html.escape(p) for p in parts)


def _mode(result) -> str:
    chooses = getattr(getattr(result, "compiled", None), "chooses", None)
    return chooses[-1].spec.mode if chooses else "max"


def _table(table, metric: str | None, mode: str) -> str:
    shown = table.drop(columns=[c for c in _HIDDEN if c in table.columns])
    if "error" in shown and shown["error"].isna().all():
        shown = shown.drop(columns=[c for c in ("error", "failed_step") if c in shown.columns])
    if metric in shown and shown[metric].dtype.kind in "fiu":
        shown = shown.sort_values(metric, ascending=mode == "min", kind="stable", na_position="last")
    more = len(shown) - MAX_ROWS
    body = shown.head(MAX_ROWS).to_html(classes="quiver-table", float_format=lambda v: f"{v:.4g}", na_rep="", border=0)
    if more > 0:
        body += f"<p>&hellip; {more} more rows: <code>result.table</code> has all {len(shown)}.</p>"
    return body


def result_html(result) -> str:
    """HTML for Jupyter: a headline, the chosen path(s), the key stats, the dashboard link and
    the table (the first :data:`MAX_ROWS` rows, ranked by the last choose's metric)."""
    from .report import choose_metric

    table = result.table
    n = 0 if table is None else len(table)
    metric = choose_metric(result) if table is not None else None
    counts = ""
    if table is not None and "status" in table:
        counts = ", ".join(f"{k} {v}" for k, v in table["status"].value_counts().items())
    link = dashboard_link(result)
    link_html = f'<p>Dashboard: <a href="{html.escape(link)}" target="_blank">{html.escape(link)}</a></p>' if link else ""
    table_html = _table(table, metric, _mode(result)) if table is not None else ""
    return (
        '<div class="quiver-result">'
        f"<p><b>Quiver result</b>: {n} branches ({html.escape(counts)})</p>"
        f"<p>Chosen:</p>{_chosen(result, table, metric)}"
        f"<p>{_stats(result.stats or {})}</p>"
        f"{link_html}{table_html}</div>"
    )
