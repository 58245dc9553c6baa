"""Reports of a finished run: PNG figures and one self-contained HTML page.

``result.plot("report/")`` (or ``quiver run FILE --report report/``) writes

* ``metrics.png``: the choose metric of every branch, one panel per explore, grouped by that
  explore's alternatives; the chosen branch(es) highlighted;
* ``training.png``: the training curves of the *kept* run(s) (only their outputs reach the
  client), when their output has a ``history`` (``gpu.train`` returns one): accuracy and loss of
  z, samples/s, replica spread.  When the run trained but no kept output has a ``history``,
  no figure is drawn and the report says why (``notes``); every run's curves, kept or not,
  are on the dashboard's training page while the scheduler lives;
* ``memory.png``: memory over time per worker, when the run recorded
  ``result.stats["worker_memory"]`` (the dashboard's samples: managed and unmanaged stacked,
  spilled as a line, the worker's limit, Dask's pause line and the memory plan's predicted
  peak per worker; the exploration page's Memory panel, static); for an older result with only
  ``result.stats["memory_timeline"]``, the measured total against the plan (the per-worker
  samples summed);
* ``report.html``: all of the above inlined (base64), the statistics and the branch table,
  the chosen rows highlighted. It needs no other file.

Matplotlib is imported only when a report is written (``pip install quiver[examples]``).

>>> import pandas as pd
>>> from pipelines.result import Result
>>> t = pd.DataFrame({"a": ["x", "y"], "a.n": [1, 2], "score": [0.5, 0.9], "status": ["ok", "ok"],
...                   "seconds": [0.1, 0.1], "chosen": [False, True], "error": [None, None]})
>>> r = Result(table=t, value=None, values=[], stats={"wall_seconds": 1.0})
>>> paths = write_report(r, tmp_dir)                                       # doctest: +SKIP
>>> sorted(paths)                                                          # doctest: +SKIP
['html', 'metrics']
>>> choose_metric(r)
'score'
"""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graph.state.status import COLORS, final_status  # the one owner of status colours

__all__ = ["write_report", "choose_metric", "memory_series"]

_TAIL = ("label", "iterations", "pruned_at", "retries", "status", "seconds", "chosen", "error", "error_kind",
         "failed_step", "traceback")


def _explores(result) -> list[str]:
    compiled = getattr(result, "compiled", None)
    if compiled is not None:
        try:
            return list(compiled.explore_names)
        except (AttributeError, TypeError):  # not a compiled pipeline: read the names off the table below
            pass
    table = result.table
    names = []
    for col in table.columns:
        if "." in col and col.split(".", 1)[0] in table.columns and col.split(".", 1)[0] not in names:
            names.append(col.split(".", 1)[0])
    return names


def choose_metric(result) -> str | None:
    """The metric the report ranks by: the last choose's, else the first numeric output column."""
    compiled = getattr(result, "compiled", None)
    if compiled is not None and getattr(compiled, "chooses", None):
        return compiled.chooses[-1].spec.metric_name
    table = result.table
    skip = set(_explores(result)) | set(_TAIL)
    for col in table.columns:
        if col in skip or "." in col:
            continue
        values = [v for v in table[col] if v is not None]
        if values and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            return col
    return None


def _not_applicable(v) -> bool:
    """A parameter cell of a branch that did not take its alternative (``pd.NA``, or ``NaN``
    in a table built before parameter columns kept their types); ``None`` is the user's."""
    return type(v).__name__ == "NAType" or (isinstance(v, float) and v != v)


def _alternative_label(row, name: str, columns) -> str:
    """``fit(C=1, max_depth=None)``: the alternative ``row`` took at explore ``name`` and its
    parameters (the rule of :func:`graph.labels.choice_text`)."""
    from graph.labels import choice_text

    params = [(c.split(".", 1)[1], row[c]) for c in columns if c.startswith(name + ".")]
    return choice_text(str(row[name]), [(p, v) for p, v in params if not _not_applicable(v)])


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


#: inches of axis per group of the metrics figure: a label (8 pt, upright) fits in each
GROUP_INCHES = 0.16
MAX_PANEL_INCHES = 18.0


def tick_step(groups: int, inches: float) -> int:
    """Label every ``step``-th group of a panel ``inches`` wide, so labels never overlap (one
    label per ``GROUP_INCHES``): all of them while they fit.

    >>> tick_step(8, 3.6), tick_step(112, 17.92), tick_step(2000, 18.0)
    (1, 1, 18)
    """
    fits = max(1, int(inches / GROUP_INCHES + 1e-9))
    return max(1, -(-groups // fits))


def _metrics_figure(result, metric: str):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    table = result.table
    explores = [e for e in _explores(result) if e in table.columns] or [None]
    panels = []
    for name in explores:
        if name is None:
            groups = {"all branches": list(table.index)}
        else:
            groups: dict[str, list] = {}
            for i, row in table.iterrows():
                groups.setdefault(_alternative_label(row, name, table.columns), []).append(i)
        panels.append((name, groups))
    # a panel grows with its groups (up to MAX_PANEL_INCHES; past that its labels are thinned)
    widths = [min(max(3.6, GROUP_INCHES * len(g)), MAX_PANEL_INCHES) for _, g in panels]
    fig = Figure(figsize=(max(6.0, sum(widths)), 4.2 if max(len(g) for _, g in panels) <= 12 else 5.6))
    axes = fig.subplots(1, len(explores), squeeze=False, sharey=True, gridspec_kw={"width_ratios": widths})[0]
    shown: set = set()
    for ax, (name, groups), inches in zip(axes, panels, widths):
        points: dict[str, tuple[list, list]] = {}
        stars: tuple[list, list] = ([], [])
        for x, rows in enumerate(groups.values()):
            n = len(rows)
            for j, i in enumerate(rows):
                row = table.loc[i]
                y = row.get(metric)
                if y is None or not isinstance(y, numbers.Real) or math.isnan(y):
                    continue
                dx = (j - (n - 1) / 2) * (0.5 / max(n, 1))
                if bool(row["chosen"]):
                    stars[0].append(x + dx)
                    stars[1].append(y)
                else:
                    xs, ys = points.setdefault(final_status(row["status"], False), ([], []))
                    xs.append(x + dx)
                    ys.append(y)
        for status, (xs, ys) in points.items():  # one call per status: thousands of points stay fast
            ax.scatter(xs, ys, s=22, color=COLORS.get(status, "#636363"), alpha=0.75, zorder=2)
            shown.add(status)
        if stars[0]:
            ax.scatter(*stars, s=140, marker="*", color=COLORS["chosen"], zorder=3, edgecolors="black", linewidths=0.6)
        labels = list(groups)
        step = tick_step(len(labels), inches)
        ax.set_xticks(range(0, len(labels), step))
        many = len(labels) > 12
        ax.set_xticklabels(labels[::step], rotation=90 if many else 30, ha="center" if many else "right", fontsize=8)
        title = f"by {name}" if name else "branches"
        if step > 1:
            title += f" ({len(labels)} alternatives; every {step}th labelled)"
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel(metric)
    handles = [Line2D([], [], marker="o", linestyle="", color=COLORS[s], label=s) for s in COLORS if s in shown]
    if handles:
        axes[-1].legend(handles=handles, fontsize=8, loc="best")
    fig.suptitle(f"{metric} per branch (star: chosen)", fontsize=11)
    return fig


def _histories(result) -> list[tuple[str, list]]:
    out = []
    chosen = list(result.table.attrs.get("kept_branches", ()))  # the rows of result.values, best first
    if not chosen and "chosen" in result.table:
        chosen = list(result.table.index[result.table["chosen"]])
    for n, value in enumerate(result.values or []):
        if isinstance(value, Mapping) and isinstance(value.get("history"), list) and value["history"]:
            label = f"branch #{chosen[n]}" if n < len(chosen) else f"kept #{n}"
            out.append((label, value["history"]))
    return out


def _training_figure(histories):
    from matplotlib.figure import Figure

    panels = [
        ("accuracy", "accuracy of z (test)", None),
        ("test_loss", "loss of z (dashed: training)", "train_loss"),
        ("samples_per_s", "samples/s", None),
        ("spread", "replica spread around z", None),
    ]
    fig = Figure(figsize=(11, 6.5))
    axes = fig.subplots(2, 2).ravel()
    for ax, (field, title, second) in zip(axes, panels):
        for k, (label, hist) in enumerate(histories):
            color = f"C{k % 10}"
            xs = [h.get("epoch", i + 1) for i, h in enumerate(hist)]
            ys = [h.get(field) for h in hist]
            if any(isinstance(y, numbers.Real) for y in ys):
                ax.plot(xs, ys, marker="o", color=color, label=label)
            if second:
                ys2 = [h.get(second) for h in hist]
                if any(isinstance(y, numbers.Real) for y in ys2):
                    ax.plot(xs, ys2, marker=".", linestyle="--", color=color)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("training of the kept run(s) only: " + ", ".join(label for label, _ in histories)
                 + " (every run: the dashboard's training page)", fontsize=10)
    fig.tight_layout()
    return fig


def memory_series(timeline: Any) -> tuple[list[float], dict[str, list[float]]]:
    """``(seconds, {series: bytes})`` from ``stats["memory_timeline"]``.

    Accepts ``[(seconds, process bytes, spilled bytes), ...]`` (what the memory planner
    records), a list of mappings with a time key (``t``/``time``/``seconds``), or a mapping
    of lists.

    >>> memory_series([(0.0, 100, 0), (0.25, 300, 50)])
    ([0.0, 0.25], {'measured process memory': [100.0, 300.0], 'spilled to disk': [0.0, 50.0]})
    """
    times: list[float] = []
    series: dict[str, list[float]] = {}
    if isinstance(timeline, Mapping):
        tkey = next((k for k in ("t", "time", "seconds") if k in timeline), None)
        if tkey is None:
            return [], {}
        times = [float(t) for t in timeline[tkey]]
        for k, v in timeline.items():
            if k != tkey and isinstance(v, (list, tuple)) and len(v) == len(times):
                series[str(k)] = [float(x) if isinstance(x, numbers.Real) else math.nan for x in v]
        return times, series
    names = ("measured process memory", "spilled to disk")
    for point in timeline or ():
        if isinstance(point, Mapping):
            tkey = next((k for k in ("t", "time", "seconds") if k in point), None)
            if tkey is None:
                continue
            times.append(float(point[tkey]))
            for k, v in point.items():
                if k != tkey and isinstance(v, numbers.Real):
                    series.setdefault(str(k), []).append(float(v))
        elif isinstance(point, (list, tuple)) and len(point) >= 2:
            times.append(float(point[0]))
            for j, v in enumerate(point[1:]):
                name = names[j] if j < len(names) else f"series {j + 1}"
                series.setdefault(name, []).append(float(v))
    return times, {k: v for k, v in series.items() if len(v) == len(times)}


def _memory_figure(result):
    from matplotlib.figure import Figure

    times, series = memory_series(result.stats.get("memory_timeline"))
    if not times or not series:
        return None
    fig = Figure(figsize=(9, 3.8))
    ax = fig.subplots()
    gib = 2**20
    for name, ys in series.items():
        ax.plot(times, [y / gib for y in ys], label=name, marker="o" if len(times) < 40 else None, markersize=3)
    plan = getattr(result, "memory_plan", None)
    for attr, style, label in (("predicted_peak", "--", "predicted peak"), ("budget", ":", "budget")):
        v = getattr(plan, attr, None) if plan is not None else None
        if isinstance(v, numbers.Real):
            ax.axhline(v / gib, linestyle=style, color="black" if attr == "budget" else "C3",
                       label=f"{label} {v / gib:.0f} MiB")
    peak = result.stats.get("peak_memory_bytes")
    if isinstance(peak, numbers.Real) and peak:
        ax.axhline(peak / gib, linestyle="-.", color="C0", alpha=0.6, label=f"measured peak {peak / gib:.0f} MiB")
    note = result.stats.get("memory_plan_note")
    if note:
        fig.text(0.01, -0.02, "\n".join(_wrap(note, 150)), fontsize=7, va="top")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("MiB (all workers)")
    ax.set_title("memory: plan vs measured" if plan is not None else "memory: measured", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


MAX_MEMORY_PANELS = 8  # workers drawn, one panel each (the title says how many more)


def _worker_memory_figure(result):
    """The exploration page's Memory panel, static: one panel per worker (``None`` without samples)."""
    from matplotlib.figure import Figure

    from graph.memory.timeline import MEMORY_COLORS as C, predicted_worker_peak, worker_series

    memory = result.stats.get("worker_memory")
    if not isinstance(memory, Mapping):
        return None
    plan = getattr(result, "memory_plan", None)
    predicted = (predicted_worker_peak(plan.predicted_peak, plan.workers) if plan is not None
                 else memory.get("predicted_worker_peak"))
    series = worker_series(memory.get("timeline"), predicted)
    if not series or not series[0]["t"]:
        return None
    shown = series[:MAX_MEMORY_PANELS]
    fig = Figure(figsize=(10.5, 1.0 + 2.3 * len(shown)))
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    mib = 2**20
    for ax, w in zip(axes, shown):
        t = w["t"]
        managed = [v / mib for v in w["managed"]]
        top = [m + u / mib for m, u in zip(managed, w["unmanaged"])]
        ax.fill_between(t, 0, managed, color=C["managed"], alpha=0.8, linewidth=0, label="managed")
        ax.fill_between(t, managed, top, color=C["unmanaged"], alpha=0.8, linewidth=0, label="unmanaged")
        ax.plot(t, [v / mib for v in w["spilled"]], color=C["spilled"], linewidth=1.5, label="spilled")
        lines = {"limit": w["limit"], "pause": w["pause"], "predicted": w["predicted"][0] if w["predicted"] else None}
        for name, style, label in (("limit", "-", "limit"), ("pause", "--", "Dask pauses"),
                                   ("predicted", "-.", "plan's predicted peak")):
            v = lines[name]
            if v:
                ax.axhline(v / mib, color=C[name], linestyle=style, linewidth=1.2, label=f"{label} {v / mib:.0f} MiB")
        ax.set_ylim(0, w["y_max"] / mib)  # the limit in view once memory nears it (graph.memory.timeline)
        ax.set_title(f"worker {w['name']}", fontsize=9)
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panel: it hides nothing
    axes[-1].set_xlabel("seconds since the run started")
    more = len(series) - len(shown)
    fig.suptitle("Memory per worker" + (f" ({more} more worker(s) not drawn)" if more > 0 else ""), fontsize=11)
    fig.tight_layout()
    return fig


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _html(result, images: dict[str, bytes], metric: str | None, title: str, notes: list[str] = ()) -> str:
    table = result.table
    cols = [c for c in table.columns if c != "traceback"]
    if "error" in table and table["error"].isna().all():
        cols = [c for c in cols if c not in ("error", "failed_step")]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in ["branch"] + cols)
    body = []
    for i, row in table.iterrows():
        chosen = bool(row.get("chosen"))
        cells = "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in cols)
        cls = ' class="chosen"' if chosen else ""
        body.append(f"<tr{cls} id=\"branch-{i}\"><td>{i}{' &#9733;' if chosen else ''}</td>{cells}</tr>")
    chosen_rows = table[table["chosen"]] if "chosen" in table else table.iloc[0:0]
    if len(chosen_rows):
        parts = []
        for i, row in chosen_rows.iterrows():
            explores = [e for e in _explores(result) if e in table.columns]
            what = ", ".join(f"{e}={_alternative_label(row, e, table.columns)}" for e in explores)
            score = f" ({metric} = {_fmt(row.get(metric))})" if metric else ""
            parts.append(f"<li>Chosen branch #{i}: {html.escape(what)}{html.escape(score)}</li>")
        chosen_html = "<ul>" + "".join(parts) + "</ul>"
    else:
        chosen_html = "<p>No branch was chosen.</p>"
    stats = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in result.stats.items()
        if isinstance(v, (numbers.Real, str)) and not isinstance(v, bool)
    )
    error = result.stats.get("error") if isinstance(result.stats, Mapping) else None
    failed_html = f'<p class="error"><b>The run failed:</b> {html.escape(str(error))}</p>' if error else ""
    notes_html = "".join(f"<p class=\"note\">{html.escape(n)}</p>" for n in notes)
    figures = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}"/></figure>'
        for name, png in images.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ddd; padding: 3px 6px; text-align: left; }}
tr.chosen td {{ background: #fdd0a2; font-weight: bold; }}
p.error {{ color: #a50f15; }}
img {{ max-width: 100%; }}
figure {{ margin: 0 0 1em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Written {time.strftime('%Y-%m-%d %H:%M:%S')}; {len(table)} branches.</p>
{failed_html}
<h2>Chosen</h2>
{chosen_html}
<h2>Figures</h2>
{notes_html}
{figures}
<h2>Branches</h2>
<table><thead><tr>{head}</tr></thead><tbody>
{''.join(body)}
</tbody></table>
<h2>Statistics</h2>
<table>{stats}</table>
</body></html>
"""


def write_report(result, path: str | Path, *, title: str | None = None) -> dict[str, Path]:
    """Write the report of ``result``; return ``{"html": path, "metrics": path, ...}``.

    ``path`` is a directory (created if needed; the files are ``report.html``, ``metrics.png``,
    ``training.png``, ``memory.png``), or a file name ending in ``.html`` (the PNGs are written
    next to it, named after it: ``run.html``, ``run-metrics.png``, ...).
    """
    path = Path(path)
    if path.suffix.lower() == ".html":
        folder, html_path, prefix = path.parent, path, path.stem + "-"
    else:
        folder, html_path, prefix = path, path / "report.html", ""
    folder.mkdir(parents=True, exist_ok=True)
    compiled = getattr(result, "compiled", None)
    if title is None:
        name = None
        if compiled is not None:
            try:
                from graph.spec import pipeline_name

                name = pipeline_name(compiled.output)
            except (AttributeError, IndexError, TypeError):  # not a pipeline's spec: a title without a name
                name = None
        title = f"Quiver report: {name}" if name else "Quiver report"
    metric = choose_metric(result)
    figures = {}
    if metric is not None and len(result.table):
        figures["metrics"] = _metrics_figure(result, metric)
    histories = _histories(result)
    notes: list[str] = []
    if histories:
        figures["training"] = _training_figure(histories)
    elif _trained(result):
        notes.append(
            "no training.png: the run trained, but no kept branch's output has a 'history' (the list "
            "gpu.train returns); return gpu.train's result, or a mapping with its 'history', from the "
            "final step to plot it"
        )
    memory = _worker_memory_figure(result) or _memory_figure(result)
    if memory is not None:
        figures["memory"] = memory
    images = {name: _png(fig) for name, fig in figures.items()}
    written: dict[str, Path] = {}
    for name, png in images.items():
        target = folder / f"{prefix}{name}.png"
        target.write_bytes(png)
        written[name] = target
    html_path.write_text(_html(result, images, metric, title, notes), encoding="utf-8")
    written["html"] = html_path
    if notes:
        written["notes"] = notes  # type: ignore[assignment]
    return written


def _trained(result) -> bool:
    """Whether a step of the run trains with ``gpu.train`` (its task key names it)."""
    compiled = getattr(result, "compiled", None)
    graph_ = getattr(compiled, "graph", None) or {}
    return any(str(k).split("-", 1)[0] in ("train", "train_step") for k in graph_) or any(
        getattr(getattr(t, "func", None), "__module__", "") == "gpu.training" for t in graph_.values()
    )
