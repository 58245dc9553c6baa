"""The Bokeh documents behind ``/quiver-exploration`` and ``/quiver-training`` (see :mod:`graph.dashboard`).

Each page reads :class:`graph.dashboard.QuiverDashboard`'s snapshot twice a second on the
scheduler's event loop and redraws only when it changed. A run picker selects the run
(default: the latest).

>>> layout = tree_layout([{"id": 0, "choices": {"a": "x"}, "status": "done", "metrics": {}},
...                       {"id": 1, "choices": {"a": "y"}, "status": "chosen", "metrics": {"m": 1.0}}], "demo")
>>> [round(y, 1) for y in layout["nodes"]["y"]]
[0.5, 0.0, 1.0]
>>> layout["nodes"]["status"]
['chosen', 'done', 'chosen']
"""

from __future__ import annotations

import html
import math
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import (
    AllIndices,
    ColumnDataSource,
    DataTable,
    Div,
    FixedTicker,
    HoverTool,
    NumberFormatter,
    Range1d,
    Select,
    Span,
    TableColumn,
)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from distributed.dashboard.components import add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env

from ..memory.timeline import MEMORY_COLORS, worker_series
from .protocol import COLORS, PLUGIN_NAME

__all__ = ["MemoryPanel", "exploration_doc", "report_lines", "training_doc", "tree_layout"]

LATEST = "(latest)"
MAX_ROWS = 150  # leaves the explore tree draws, one label row each; more branches are collapsed (tree_layout)
ROW_PX = 16  # the height of one row of the tree


def _plugin(scheduler):
    return scheduler.plugins.get(PLUGIN_NAME)


def _legend_html() -> str:
    items = "".join(
        f'<span style="display:inline-block;margin-right:12px">'
        f'<span style="display:inline-block;width:11px;height:11px;border-radius:6px;background:{c};'
        f'border:1px solid #555;margin-right:4px"></span>{s}</span>'
        for s, c in COLORS.items()
    )
    return f'<div style="font-size:12px">{items}</div>'


def _branch_info(b: dict) -> str:
    metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in b["metrics"].items())
    info = f"#{b['id']} {b['status']}" + (f"  {metrics}" if metrics else "")
    if b.get("pruned_at") is not None:
        info += f"  pruned at iteration {b['pruned_at']}"
    elif b.get("iterations"):
        info += f"  {b['iterations']} iterations"
    if isinstance(b.get("last_report"), (int, float)):
        info += f" (last report {b['last_report']:.4g})"
    if b.get("error"):
        info += f"  {b['error'][:120]}"
    if b.get("story"):
        info += f"  story: {_story_line(b['story'])}"
    return info


def _story_line(story: list, last: int = 6) -> str:
    """A failed branch's story (the state machine's last handlings naming its tasks) as its
    stimulus ids, oldest first: ``run-started → fit-3f2a-error``."""
    sids = [str(e.get("stimulus", "")) for e in story[-last:] if isinstance(e, dict)]
    return ("… → " if len(story) > last else "") + " → ".join(sids)


#: the order a collapsed group's colour is picked in: the first status any of its branches has
_GROUP_COLOUR = ("chosen", "running", "waiting", "done", "failed", "pruned", "dropped", "cancelled")


def _group_status(statuses: list[str]) -> str:
    present = set(statuses)
    return next((s for s in _GROUP_COLOUR if s in present), statuses[0] if statuses else "waiting")


def _counts_text(statuses: list[str]) -> str:
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st] = counts.get(st, 0) + 1
    order = sorted(counts, key=lambda st: _GROUP_COLOUR.index(st) if st in _GROUP_COLOUR else len(_GROUP_COLOUR))
    return ", ".join(f"{counts[st]} {st}" for st in order)


def tree_layout(branches: list[dict], root: str, max_rows: int = MAX_ROWS) -> dict:
    """Node and edge coordinates of the explore tree: depth on x, one row per shown leaf on y.

    Every shown leaf has a row of its own, so its label never overlaps another: with more than
    ``max_rows`` branches the tree is cut at the deepest explore that still fits, each node there
    standing for its branches (``"model=svc: 400 branches (1 chosen, 399 dropped)"``, coloured by
    its most telling status: chosen, then running...), and when even the first explore has more
    alternatives than rows, consecutive ones are grouped. ``rows``: the rows drawn (the page's
    height follows them).

    >>> bs = [{"id": i, "choices": {"a": f"x{i // 10}", "b": f"y{i}"}, "status": "chosen" if i == 7 else "dropped",
    ...        "metrics": {}} for i in range(40)]
    >>> cut = tree_layout(bs, "demo", max_rows=5)
    >>> cut["rows"], [t for t in cut["nodes"]["label"] if t.startswith("a=x0")]
    (4, ['a=x0: 10 branches (1 chosen, 9 dropped)'])
    >>> tree_layout(bs, "demo", max_rows=3)["nodes"]["label"][1]
    'a=x0 … a=x1: 20 branches (1 chosen, 19 dropped)'
    """
    nodes: dict[tuple, dict] = {(): {"label": root, "depth": 0, "leaves": [], "branch": None, "children": []}}
    order: list[tuple] = [()]
    for n, b in enumerate(branches):
        path: tuple = ()
        items = list(b["choices"].items()) or [("branch", f"#{b['id']}")]
        for depth, (name, text) in enumerate(items, start=1):
            parent, path = path, path + ((name, text),)
            if path not in nodes:
                nodes[path] = {"label": f"{name}={text}", "depth": depth, "leaves": [], "branch": None, "children": []}
                nodes[parent]["children"].append(path)
                order.append(path)
            nodes[path]["leaves"].append(n)
        nodes[path]["branch"] = b
    nodes[()]["leaves"] = list(range(len(branches)))

    def rows_at(cut: int) -> list[tuple]:
        """The shown leaves when the tree is cut at depth ``cut``, in order."""
        return [p for p in order if 0 < nodes[p]["depth"] <= cut
                and (nodes[p]["depth"] == cut or nodes[p]["branch"] is not None and not nodes[p]["children"])]

    deepest = max((nodes[p]["depth"] for p in order), default=0)
    cut = deepest
    while cut > 1 and len(rows_at(cut)) > max_rows:
        cut -= 1
    shown = rows_at(cut)
    grouped: list[tuple] = []
    if len(shown) > max_rows:  # the first explore alone has more alternatives than rows: group them in runs
        size = -(-len(shown) // max_rows)
        for start in range(0, len(shown), size):
            run = shown[start:start + size]
            key = ("group", start)
            first, last = nodes[run[0]]["label"], nodes[run[-1]]["label"]
            nodes[key] = {"label": first if len(run) == 1 else f"{first} … {last}", "depth": 1,
                          "leaves": [i for p in run for i in nodes[p]["leaves"]], "branch": None, "children": []}
            grouped.append(key)
        nodes[()]["children"] = grouped
        shown = grouped
    collapsed = {p for p in shown if nodes[p]["children"] or nodes[p]["branch"] is None}
    row_of = {p: float(r) for r, p in enumerate(shown)}

    def y_of(p: tuple) -> float:  # a shown row's own; an inner node's, the mean of its children's
        if p in row_of:
            return row_of[p]
        ys = [y_of(c) for c in nodes[p]["children"]]
        return sum(ys) / len(ys) if ys else 0.0

    drawn = [()] + (grouped if grouped else [p for p in order if 0 < nodes[p]["depth"] <= cut])
    out = {k: [] for k in ("x", "y", "color", "label", "status", "size", "line", "width", "info")}
    edges = {k: [] for k in ("x0", "y0", "x1", "y1", "color", "width")}
    parent_of = {c: p for p in nodes for c in nodes[p]["children"]}
    for path in drawn:
        nd = nodes[path]
        y = y_of(path)
        statuses = [branches[i]["status"] for i in nd["leaves"]]
        b = nd["branch"] if path not in collapsed else None
        if b is not None:
            status = b["status"]
            info = _branch_info(b)
            label = f"{nd['label']}  {info}"
        elif path in collapsed:
            status = _group_status(statuses)
            info = f"{nd['label']}: {len(statuses)} branches ({_counts_text(statuses)})"
            label = info
        else:
            status = "chosen" if "chosen" in statuses else ("running" if "running" in statuses else "inner")
            info = f"{nd['label']}: {len(nd['leaves'])} branch(es)"
            label = nd["label"]
        chosen_path = "chosen" in statuses
        leaf = path in row_of
        out["x"].append(float(nd["depth"]))
        out["y"].append(float(y))
        out["color"].append(COLORS.get(status, "#ffffff") if leaf else "#ffffff")
        out["label"].append(label)
        out["status"].append(status)
        out["size"].append(14 if leaf else 10)
        out["line"].append("#e6550d" if chosen_path else "#636363")
        out["width"].append(3 if (leaf and status == "chosen") else 1)
        out["info"].append(info)
        if path:
            parent = parent_of.get(path, ())
            edges["x0"].append(float(nodes[parent]["depth"]))
            edges["y0"].append(float(y_of(parent)))
            edges["x1"].append(float(nd["depth"]))
            edges["y1"].append(float(y))
            edges["color"].append("#e6550d" if chosen_path else "#bdbdbd")
            edges["width"].append(3 if chosen_path else 1)
    return {"nodes": out, "edges": edges, "rows": len(shown)}


def _pick_run(plugin, selected: str | None) -> dict | None:
    if plugin is None or not plugin.runs:
        return None
    if selected and selected != LATEST and selected in plugin.runs:
        return plugin.run_view(plugin.runs[selected])
    return plugin.run_view(next(reversed(plugin.runs.values())))


def _run_options(plugin) -> list[str]:
    if plugin is None:
        return [LATEST]
    return [LATEST] + [r for r in reversed(plugin.runs)]


def _cut(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, an ellipsis marking the cut."""
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


class _RunPage:
    """What both pages share: the run picker (a change redraws at once) and a header."""

    def __init__(self, scheduler, empty_header: str):
        self.scheduler = scheduler
        self.last = None
        self.select = Select(title="Run", value=LATEST, options=[LATEST], width=320)
        self.select.on_change("value", lambda attr, old, new: self.update(force=True))
        self.header = Div(text=empty_header, sizing_mode="stretch_width")

    def refresh_runs(self):
        """The scheduler's Quiver plugin (``None`` without one), after listing its runs in the picker."""
        plugin = _plugin(self.scheduler)
        options = _run_options(plugin)
        if options != list(self.select.options):
            self.select.options = options
        return plugin

    def update(self, force: bool = False) -> None:
        raise NotImplementedError


MIB = 2**20
MAX_MEMORY_FIGURES = 8  # workers drawn one figure each; the header says how many more there are


class MemoryPanel:
    """The exploration page's "Memory" panel: per worker, managed and unmanaged memory stacked,
    spilled bytes as a line, the worker's memory limit, Dask's pause line and, when the run has a
    memory plan, its predicted peak per worker (what ``QuiverDashboard.memory_view`` holds)."""

    def __init__(self):
        self.header = Div(text="<h4>Memory</h4><p>No samples yet.</p>", sizing_mode="stretch_width")
        self.figures: list[tuple[Any, ColumnDataSource, dict[str, Span]]] = []
        self.root = column(self.header, sizing_mode="stretch_width")
        self.last = None

    def _figure(self):
        fig = figure(height=220, sizing_mode="stretch_width", tools="pan,wheel_zoom,box_zoom,reset,save",
                     toolbar_location="above", title="Memory", y_range=Range1d(0, 1))
        src = ColumnDataSource({k: [] for k in ("t", "zero", "managed", "top", "spilled")})
        fig.varea(x="t", y1="zero", y2="managed", source=src, fill_color=MEMORY_COLORS["managed"], fill_alpha=0.8,
                  legend_label="managed")
        fig.varea(x="t", y1="managed", y2="top", source=src, fill_color=MEMORY_COLORS["unmanaged"], fill_alpha=0.8,
                  legend_label="unmanaged")
        fig.line(x="t", y="spilled", source=src, line_color=MEMORY_COLORS["spilled"], line_width=2,
                 legend_label="spilled")
        spans = {}
        for name, dash in (("limit", "solid"), ("pause", "dashed"), ("predicted", "dotdash")):
            spans[name] = Span(location=0, dimension="width", line_color=MEMORY_COLORS[name], line_dash=dash,
                               line_width=2, visible=False)
            fig.add_layout(spans[name])
        fig.add_tools(HoverTool(tooltips=[("s", "@t{0.0}"), ("managed MiB", "@managed{0}"),
                                          ("managed+unmanaged MiB", "@top{0}"), ("spilled MiB", "@spilled{0}")],
                                mode="vline"))
        fig.xaxis.axis_label = "seconds since the run started"
        fig.yaxis.axis_label = "MiB"
        fig.legend.location = "top_left"
        fig.legend.label_text_font_size = "9px"
        fig.legend.background_fill_alpha = 0.6
        self.figures.append((fig, src, spans))
        self.root.children.append(fig)

    def show(self, memory: dict | None, run: str | None = None) -> None:
        """Draw ``memory`` (``QuiverDashboard.memory_view`` of ``run``); redraws only when it changed."""
        timeline = (memory or {}).get("timeline") or {}
        predicted = (memory or {}).get("predicted_worker_peak")
        t = timeline.get("t") or []
        sig = (run, len(t), t[-1] if t else None, predicted, len(timeline.get("workers") or {}))
        if sig == self.last:
            return
        self.last = sig
        series = worker_series(timeline, predicted)
        shown = series[:MAX_MEMORY_FIGURES]
        while len(self.figures) < len(shown):
            self._figure()
        for n, (fig, src, spans) in enumerate(self.figures):
            fig.visible = n < len(shown)
            if n >= len(shown):
                continue
            w = shown[n]
            managed = [v / MIB for v in w["managed"]]
            src.data = {"t": w["t"], "zero": [0.0] * len(w["t"]), "managed": managed,
                        "top": [m + u / MIB for m, u in zip(managed, w["unmanaged"])],
                        "spilled": [v / MIB for v in w["spilled"]]}
            lines = {"limit": w["limit"], "pause": w["pause"], "predicted": w["predicted"][0] if w["predicted"] else None}
            for name, span in spans.items():
                span.visible = lines[name] is not None
                if lines[name] is not None:
                    span.location = lines[name] / MIB
            fig.y_range.start, fig.y_range.end = 0, w["y_max"] / MIB  # the limit in view once memory nears it
            parts = [f"worker {w['name']}"]
            shown_at = lambda v, how: how if v <= w["y_max"] else "above the chart"  # noqa: E731
            if w["limit"]:
                parts.append(f"limit {w['limit'] / MIB:.0f} MiB ({shown_at(w['limit'], 'solid')})")
            if w["pause"]:
                parts.append(f"Dask pauses at {w['pause'] / MIB:.0f} MiB ({shown_at(w['pause'], 'dashed')})")
            if w["predicted"]:
                parts.append(f"plan's predicted peak {w['predicted'][0] / MIB:.0f} MiB (dot-dash)")
            fig.title.text = "Memory: " + "; ".join(parts)
        more = len(series) - len(shown)
        self.header.text = (
            "<h4>Memory</h4><p>" + (f"{len(t)} samples per worker; " if t else "No samples yet. ")
            + "stacked: managed (results Dask holds) and unmanaged (the rest of the process); line: spilled to disk"
            + (f"; {more} more worker(s) not drawn" if more > 0 else "") + ".</p>"
        )


class ExplorationPage(_RunPage):
    """The explore/choose tree and the table of one run."""

    def __init__(self, scheduler):
        super().__init__(
            scheduler, "<h3>Quiver: exploration</h3><p>No Quiver run has published to this scheduler yet.</p>"
        )
        self.legend = Div(text=_legend_html(), sizing_mode="stretch_width")
        self.nodes = ColumnDataSource({k: [] for k in ("x", "y", "color", "label", "status", "size", "line", "width", "info")})
        self.edges = ColumnDataSource({k: [] for k in ("x0", "y0", "x1", "y1", "color", "width")})
        fig = figure(height=420, sizing_mode="stretch_width", tools="pan,wheel_zoom,box_zoom,reset,save",
                     title="Explore tree (x: explore depth; one leaf per branch)", toolbar_location="above")
        fig.segment("x0", "y0", "x1", "y1", source=self.edges, line_color="color", line_width="width")
        dots = fig.scatter("x", "y", source=self.nodes, size="size", fill_color="color", line_color="line",
                           line_width="width")
        fig.text("x", "y", text="label", source=self.nodes, x_offset=10, y_offset=6, text_font_size="9px",
                 text_baseline="middle")
        fig.add_tools(HoverTool(renderers=[dots], tooltips=[("", "@info")]))
        fig.yaxis.visible = False
        fig.xaxis.axis_label = "explore (depth)"
        fig.xaxis.ticker = FixedTicker(ticks=[0, 1])  # whole depths only: set per run in update()
        fig.ygrid.visible = False
        self.fig = fig
        self.table_source = ColumnDataSource({"branch": []})
        self.table = DataTable(source=self.table_source, columns=[TableColumn(field="branch", title="branch")],
                               sortable=True, sizing_mode="stretch_width", height=360, index_position=None)
        self.memory = MemoryPanel()
        self.root = column(row(self.select, sizing_mode="stretch_width"), self.header, self.legend, self.fig,
                           self.memory.root, self.table, sizing_mode="stretch_width")

    def update(self, force: bool = False) -> None:
        plugin = self.refresh_runs()
        run = _pick_run(plugin, self.select.value)
        if run is None:
            return
        raw = plugin.runs.get(run["run"])
        if raw is not None:  # sampled twice a second whatever the branches do: redrawn on its own
            self.memory.show(plugin.memory_view(raw), run["run"])
        sig = (run["run"], plugin.version, tuple(b["status"] for b in run["branches"]))
        if sig == self.last and not force:
            return
        self.last = sig
        counts = ", ".join(f"{n} {s}" for s, n in run["counts"].items() if n)
        chooses = "; ".join(
            f"choose {c['metric']} ({c.get('mode')}"
            + (f", k={c['k']}" if c.get("k") else "")
            + (f", threshold={c['threshold']}" if c.get("threshold") is not None else "")
            + (f", per {c['per']}" if c.get("per") else "") + ")"
            for c in run["chooses"]
        )
        chosen = [b for b in run["branches"] if b["status"] == "chosen"]
        chosen_txt = "; ".join(
            f"#{b['id']} " + " ".join(b["choices"].values())
            + "".join(f" {k}={_fmt(v)}" for k, v in b["metrics"].items())
            for b in chosen
        ) or "none yet"
        best = run["best"]
        best_txt = f"best {best['metric']} = {_fmt(best['value'])} (branch #{best['branch']})" if best else ""
        if run["total_branches"] > len(run["branches"]):
            counts = f"too many to show here ({run['total_branches']}); the summary only"
        self.header.text = (
            f"<h3>Quiver: exploration <code>{html.escape(run['name'])}</code> "
            f"<small>run {html.escape(run['run'])}: {run['state']}</small></h3>"
            f"<p>{run['total_branches']} branches: {html.escape(counts)}. {html.escape(chooses)}. {html.escape(best_txt)}</p>"
            f"<p><b>Chosen:</b> {html.escape(chosen_txt)}</p>"
            + (f"<p style='color:#a50f15'>{html.escape(run['error'])}</p>" if run.get("error") else "")
        )
        layout = tree_layout(run["branches"], run["name"])
        self.nodes.data = layout["nodes"]
        self.edges.data = layout["edges"]
        depth = max(layout["nodes"]["x"] or [0])
        rows = layout["rows"]
        self.fig.height = max(420, rows * ROW_PX + 90)  # a row per shown leaf: labels never overlap
        self.fig.x_range.start, self.fig.x_range.end = -0.2, depth + 1.6
        self.fig.xaxis.ticker.ticks = list(range(int(depth) + 1))  # no tick between two depths (0.5, 1.5)
        self.fig.y_range.start, self.fig.y_range.end = -1, max(rows, 1)
        if rows < len(run["branches"]):
            self.fig.title.text = (f"Explore tree: {len(run['branches'])} branches shown as {rows} rows "
                                   "(a node stands for the branches under it; the table below lists each)")
        else:
            self.fig.title.text = "Explore tree (x: explore depth; one leaf per branch)"
        self._table(run)

    def _table(self, run: dict) -> None:
        explores = list(run["explores"])
        params = []
        metrics = []
        for b in run["branches"]:
            for p in b["params"]:
                if p not in params:
                    params.append(p)
            for m in b["metrics"]:
                if m not in metrics:
                    metrics.append(m)
        # field names are prefixed so a metric or explore called "error" or "status" cannot
        # collide with the fixed columns; titles are escaped (BokehJS renders them as HTML)
        data: dict[str, list] = {"branch": [], "status": [], "chosen": [], "error": [], "story": []}
        iterative = any(b.get("iterations") is not None for b in run["branches"])
        if iterative:  # iterative steps (docs/architecture.md §7): reports made, where pruned
            data["iterations"], data["pruned at"], data["last report"] = [], [], []
        for col in [f"e:{e}" for e in explores] + [f"p:{p}" for p in params] + [f"m:{m}" for m in metrics]:
            data[col] = []
        for b in run["branches"]:
            data["branch"].append(b["id"])
            data["status"].append(b["status"])
            data["chosen"].append("chosen" if b["status"] == "chosen" else "")
            data["error"].append(b["error"] or "")
            data["story"].append(_story_line(b["story"]) if b.get("story") else "")
            if iterative:
                data["iterations"].append(b.get("iterations") or 0)
                data["pruned at"].append("" if b.get("pruned_at") is None else f"iteration {b['pruned_at']}")
                last = b.get("last_report")
                data["last report"].append(float(last) if isinstance(last, (int, float)) else math.nan)
            for e in explores:
                data[f"e:{e}"].append(b["labels"].get(e, ""))
            for p in params:
                v = b["params"].get(p)
                data[f"p:{p}"].append(v if isinstance(v, (int, float)) and not isinstance(v, bool) else _fmt(v))
            for m in metrics:
                v = b["metrics"].get(m)
                data[f"m:{m}"].append(float(v) if isinstance(v, (int, float)) else math.nan)
        esc = html.escape
        columns = [TableColumn(field="branch", title="branch", width=60)]
        columns += [TableColumn(field=f"e:{e}", title=esc(e)) for e in explores]
        columns += [TableColumn(field=f"p:{p}", title=esc(p)) for p in params]
        columns += [
            TableColumn(field=f"m:{m}", title=esc(m), formatter=NumberFormatter(format="0.0000")) for m in metrics
        ]
        if iterative:
            columns += [TableColumn(field=c, title=c) for c in ("iterations", "pruned at")]
            columns.append(TableColumn(field="last report", title="last report", formatter=NumberFormatter(format="0.0000")))
        columns += [TableColumn(field=c, title=c) for c in ("status", "chosen", "error")]
        if any(data["story"]):  # failed branches: the state machine's last handlings naming their tasks
            columns.append(TableColumn(field="story", title="story"))
        if [c.field for c in self.table.columns] != [c.field for c in columns]:
            self.table.columns = columns
        self.table_source.data = data
        # BokehJS redraws a DataTable when its view changes, not when only its source's values do
        self.table.view.filter = AllIndices()


def _serve(page: _RunPage, title: str, extra: dict, doc) -> None:
    """Put ``page`` in ``doc`` (Dask's template, theme and navigation), redrawn twice a second."""
    page.update(force=True)
    add_periodic_callback(doc, page, 500)
    doc.title = title
    doc.add_root(page.root)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


def exploration_doc(scheduler, extra, doc):
    _serve(ExplorationPage(scheduler), "Quiver: Exploration", extra, doc)


_CURVES = [
    # (field, title, y axis label)
    ("accuracy", "Accuracy of z (test split)", "accuracy"),
    ("test_loss", "Loss of z (test split; dashed: training loss)", "loss"),
    ("spread", "Spread of the replicas around z", "max ||w_j - z||"),
    ("samples_per_s", "Throughput", "samples/s"),
    ("replicas", "Replicas per worker", "replicas"),
    ("compute_s", "Compute (solid) vs sync (dashed) seconds per epoch", "seconds"),
]


MAX_LEGEND = 16  # report curves; with more, the legend would hide the plot: hover names each line
REPORTS_PX = 300  # the reports figure's plot height (its legend adds to it)
PANEL_PX = 260  # a training panel's plot height
LEGEND_CHARS = 90  # a legend entry's longest text (the table above shows it whole)

#: the panels' titles for a plain loop (``gpu.Loop``, ``algorithm`` "loop..."): one model, no central z
_LOOP_TITLES = {
    "accuracy": "Accuracy (test split)",
    "test_loss": "Loss (test split; dashed: training loss)",
    "compute_s": "Training seconds per epoch",
}
#: panels that only ``gpu.train``'s model averaging fills meaningfully (a plain loop has one replica)
_GANG_ONLY = ("spread", "replicas")


def legend_outside(fig: Any) -> None:
    """Move ``fig``'s legend below the plot (the plot's whole width for a branch's label), so
    it never covers a curve."""
    for legend in list(fig.legend):
        if legend in fig.center:
            fig.center.remove(legend)
        legend.location = "top_left"
        legend.spacing = 0
        legend.padding = 4
        fig.add_layout(legend, "below")
    fig.xaxis.ticker.min_interval = 1  # epochs and iterations are whole: no tick at 1.5


#: pixels a legend row takes under a plot (9 px text); a figure grows by this much per entry
LEGEND_ROW_PX = 17


def fit_legend(fig: Any, base: int, entries: int) -> None:
    """Give ``fig`` its plot's ``base`` height plus its legend's rows (the legend sits below)."""
    fig.height = base + 30 + LEGEND_ROW_PX * entries if entries else base


def gang_training(views: list[dict]) -> bool:
    """Whether any shown training is ``gpu.train``'s model averaging (its panels: accuracy of
    z, spread of the replicas), not only plain loops (``gpu.Loop``, algorithm ``loop``).

    >>> gang_training([{"algorithm": "loop"}]), gang_training([{"algorithm": "loop"}, {"algorithm": "sma"}])
    (False, True)
    """
    return any(v.get("algorithm") and not str(v["algorithm"]).startswith("loop") for v in views)


def panels_with_data(lines: dict[str, dict[str, list]]) -> list[str]:
    """The training panels to show: those with at least one line (``gpu.train`` fills them; a run
    without it shows none of them, not six empty frames).

    >>> panels_with_data({"accuracy": {"xs": [[1, 2]]}, "spread": {"xs": []}, "tuning": {"xs": []}})
    ['accuracy']
    """
    return [k for k, v in lines.items() if v.get("xs")]


def report_lines(curves: dict | None) -> dict:
    """What the reports figure draws from ``QuiverDashboard.curves_view``: one line per branch
    (colour: its status), an ``x`` where a pruned branch stopped (at ``pruned_at``, on its
    curve), and a dotted vertical line per rung across the values' range.

    >>> out = report_lines({"metric": "score", "rungs": [1, 3], "branches": [
    ...     {"id": 0, "label": "#0 a", "status": "chosen", "curve": [0.5, 0.7, 0.9, 0.95], "pruned_at": None},
    ...     {"id": 1, "label": "#1 b", "status": "pruned", "curve": [0.2], "pruned_at": 1}]})
    >>> out["lines"]["xs"], out["marks"]["x"], out["marks"]["y"], out["rungs"]["x0"], out["rungs"]["y1"]
    ([[1, 2, 3, 4], [1]], [1], [0.2], [1, 3], [0.95, 0.95])
    """
    lines: dict[str, list] = {"xs": [], "ys": [], "color": [], "label": [], "dash": [], "status": []}
    marks: dict[str, list] = {"x": [], "y": [], "label": []}
    values = []
    for b in (curves or {}).get("branches", ()):
        xy = [(i, v) for i, v in enumerate(b["curve"], start=1) if isinstance(v, (int, float))]
        values += [v for _, v in xy]
        lines["xs"].append([x for x, _ in xy])
        lines["ys"].append([y for _, y in xy])
        lines["color"].append(COLORS.get(b["status"], "#636363"))
        lines["label"].append(f"{_cut(b['label'], LEGEND_CHARS)} ({b['status']})")  # its choices: hover and legend
        lines["status"].append(b["status"])
        lines["dash"].append("dashed" if b["status"] == "pruned" else "solid")
        stop = b.get("pruned_at")
        if stop is not None and 0 < stop <= len(b["curve"]) and isinstance(b["curve"][stop - 1], (int, float)):
            marks["x"].append(stop)
            marks["y"].append(b["curve"][stop - 1])
            marks["label"].append(f"{_cut(b['label'], LEGEND_CHARS)} pruned at iteration {stop}")
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    rungs = list((curves or {}).get("rungs", ()))
    return {
        "lines": lines,
        "marks": marks,
        "rungs": {"x0": rungs, "x1": rungs, "y0": [low] * len(rungs), "y1": [high] * len(rungs)},
    }


class TrainingPage(_RunPage):
    """Live curves of every training branch of the selected run, and the report curves of
    its iterative steps with the pruning choose's rungs (docs/architecture.md §7)."""

    def __init__(self, scheduler):
        super().__init__(scheduler, "<h3>Quiver: training</h3><p>No training branch has reported yet.</p>")
        self.report_sources = {
            "lines": ColumnDataSource({"xs": [], "ys": [], "color": [], "label": [], "dash": [], "status": []}),
            "marks": ColumnDataSource({"x": [], "y": [], "label": []}),
            "rungs": ColumnDataSource({"x0": [], "y0": [], "x1": [], "y1": []}),
        }
        reports = figure(height=REPORTS_PX, sizing_mode="stretch_width", title="Reports per iteration",
                         tools="pan,wheel_zoom,reset,save", toolbar_location="above")
        reports.segment("x0", "y0", "x1", "y1", source=self.report_sources["rungs"], line_color="#636363",
                        line_dash="dotted", line_width=1)
        drawn = reports.multi_line("xs", "ys", source=self.report_sources["lines"], line_color="color", line_width=2,
                                   line_dash={"field": "dash"}, hover_line_color="color", hover_line_width=5,
                                   legend_field="label")
        reports.legend.label_text_font_size = "9px"
        legend_outside(reports)
        ends = reports.scatter("x", "y", source=self.report_sources["marks"], marker="x", size=12, line_width=3,
                               color="#a50f15")
        reports.add_tools(HoverTool(renderers=[drawn], tooltips=[("branch", "@label"), ("iteration", "$x{0}"),
                                                                  ("value", "$y{0.0000}")], line_policy="nearest"))
        reports.add_tools(HoverTool(renderers=[ends], tooltips=[("", "@label")]))
        reports.xaxis.axis_label = "iteration (reports made)"
        reports.visible = False  # shown when the run's iterative steps have reported
        self.reports = reports
        self.sources: dict[str, ColumnDataSource] = {}
        self.points: dict[str, ColumnDataSource] = {}
        self.panels: dict[str, Any] = {}  # field -> its figure, shown only when the run has data for it
        figs = []
        for field, title, ylabel in _CURVES:
            fig = figure(height=PANEL_PX, sizing_mode="stretch_width", title=title, tools="pan,wheel_zoom,reset,save,hover",
                         tooltips=[("branch", "@label"), ("epoch", "$x{0}"), (ylabel, "$y{0.0000}")])
            src = self.sources[field] = ColumnDataSource({"xs": [], "ys": [], "color": [], "label": [], "dash": []})
            pts = self.points[field] = ColumnDataSource({"x": [], "y": [], "color": [], "label": []})
            fig.multi_line("xs", "ys", source=src, line_color="color", line_width=2, line_dash={"field": "dash"},
                           legend_field="label")
            fig.scatter("x", "y", source=pts, color="color", size=6)
            fig.xaxis.axis_label = "epoch"
            fig.yaxis.axis_label = ylabel
            fig.legend.label_text_font_size = "9px"
            legend_outside(fig)
            fig.visible = False
            self.panels[field] = fig
            figs.append(fig)
        tune = figure(height=260, sizing_mode="stretch_width", title="Auto-tuner: total samples/s per replica count",
                      tools="pan,wheel_zoom,reset,save,hover", tooltips=[("branch", "@label"), ("replicas", "$x{0}"),
                                                                          ("samples/s", "$y{0}")])
        self.sources["tuning"] = ColumnDataSource({"xs": [], "ys": [], "color": [], "label": [], "dash": []})
        self.points["tuning"] = ColumnDataSource({"x": [], "y": [], "color": [], "label": []})
        tune.multi_line("xs", "ys", source=self.sources["tuning"], line_color="color", line_width=2)
        tune.scatter("x", "y", source=self.points["tuning"], color="color", size=8)
        tune.xaxis.axis_label = "replicas per worker"
        tune.yaxis.axis_label = "samples/s (all workers)"
        tune.visible = False
        self.panels["tuning"] = tune
        figs.append(tune)
        grid_rows = [row(figs[i], figs[i + 1], sizing_mode="stretch_width") for i in range(0, len(figs) - 1, 2)]
        if len(figs) % 2:
            grid_rows.append(row(figs[-1], sizing_mode="stretch_width"))
        self.root = column(self.select, self.header, self.reports, *grid_rows, sizing_mode="stretch_width")

    def show_reports(self, curves: dict | None) -> str:
        """Draw ``curves`` (``QuiverDashboard.curves_view``); return the header's line about them."""
        drawn = report_lines(curves)
        for name, src in self.report_sources.items():
            src.data = drawn[name]
        self.reports.visible = curves is not None
        if curves is None:
            return ""
        n = len(curves["branches"])
        self.reports.legend.visible = n <= MAX_LEGEND  # beyond, hover a line for its configuration
        fit_legend(self.reports, REPORTS_PX, n if n <= MAX_LEGEND else 0)
        pruned = len(drawn["marks"]["x"])
        rungs = ", ".join(str(r) for r in curves["rungs"])
        self.reports.title.text = (
            f"Reports: {curves['metric']} ({curves['mode']}) per iteration"
            + (f"; dotted: rungs at {rungs}; x: pruned" if rungs else "")
        )
        self.reports.yaxis.axis_label = str(curves["metric"])
        return (
            f"<p>{n} branch(es) reported {html.escape(str(curves['metric']))}"
            + (f"; rungs at iterations {rungs}" if rungs else "") + f"; {pruned} pruned.</p>"
        )

    def update(self, force: bool = False) -> None:
        plugin = self.refresh_runs()
        if plugin is None:
            return
        sig = (self.select.value, plugin.version)
        if sig == self.last and not force:
            return
        self.last = sig
        run = _pick_run(plugin, self.select.value)
        views = [plugin.training_view(t) for t in plugin.training.values()]
        if run is not None:
            views = [v for v in views if v["run"] == run["run"]] or ([] if self.select.value != LATEST else views[-4:])
        rows = []
        lines: dict[str, dict[str, list]] = {k: {"xs": [], "ys": [], "color": [], "label": [], "dash": []} for k in self.sources}
        pts: dict[str, dict[str, list]] = {k: {"x": [], "y": [], "color": [], "label": []} for k in self.points}

        def add(kind, xs, ys, color, label, dash="solid"):
            xy = [(x, y) for x, y in zip(xs, ys) if isinstance(y, (int, float))]
            if not xy:
                return
            lines[kind]["xs"].append([p[0] for p in xy])
            lines[kind]["ys"].append([p[1] for p in xy])
            lines[kind]["color"].append(color)
            lines[kind]["label"].append(label)
            lines[kind]["dash"].append(dash)
            for x, y in xy:
                pts[kind]["x"].append(x)
                pts[kind]["y"].append(y)
                pts[kind]["color"].append(color)
                pts[kind]["label"].append(label)

        for n, v in enumerate(views):
            color = Category10_10[n % 10]
            label = _cut(v["label"], LEGEND_CHARS)
            ep = v["epochs"]
            xs = [e["epoch"] for e in ep]
            add("accuracy", xs, [e["accuracy"] for e in ep], color, label)
            add("test_loss", xs, [e["test_loss"] for e in ep], color, label)
            add("test_loss", xs, [e["train_loss"] for e in ep], color, label + " (train)", "dashed")
            add("spread", xs, [e["spread"] for e in ep], color, label)
            add("samples_per_s", xs, [e["samples_per_s"] for e in ep], color, label)
            add("replicas", xs, [e["replicas"] for e in ep], color, label)
            add("compute_s", xs, [e["compute_s"] for e in ep], color, label + " compute")
            add("compute_s", xs, [e["sync_s"] for e in ep], color, label + " sync", "dashed")
            if v["tuning"]:
                add("tuning", [t[0] for t in v["tuning"]], [t[1] for t in v["tuning"]], color, label)
            last = ep[-1] if ep else {}
            workers = ", ".join(f"{html.escape(str(w))}: {k}" for w, k in sorted(v["workers"].items()))
            rows.append(
                f"<tr><td style='color:{color}'>&#9632;</td><td>{html.escape(v['label'])}</td><td>{v['state']}</td>"
                f"<td>{v['algorithm'] or ''}</td><td>{len(ep)}/{v['epochs_total'] or '?'}</td>"
                f"<td>{_fmt(last.get('accuracy'))}</td><td>{_fmt(last.get('samples_per_s'))}</td>"
                + (f"<td>{workers}</td>" if gang_training([v]) else "<td></td>") + "</tr>"
            )
        for k, src in self.sources.items():
            src.data = lines[k]
            self.points[k].data = pts[k]
        shown = panels_with_data(lines)
        gang = gang_training(views)
        if not gang:  # plain loops: one model each, no central z, no replicas
            shown = [k for k in shown if k not in _GANG_ONLY]
        for field, title, _ in _CURVES:
            self.panels[field].title.text = title if gang else _LOOP_TITLES.get(field, title)
        for k, fig in self.panels.items():
            fig.visible = k in shown
            if k != "tuning":
                fit_legend(fig, PANEL_PX, len(set(lines[k]["label"])))
        title = f"run {html.escape(run['run'])} ({html.escape(run['name'])})" if run else ""
        raw = plugin.runs.get(run["run"]) if run is not None else None
        reported = self.show_reports(plugin.curves_view(raw) if raw is not None else None)
        if rows:
            self.header.text = (
                f"<h3>Quiver: training <small>{title}</small></h3>{reported}"
                "<table style='font-size:12px'><tr><th></th><th>branch</th><th>state</th><th>algorithm</th>"
                "<th>epochs</th>" + ("<th>accuracy of z</th>" if gang_training(views) else "<th>accuracy</th>")
                + "<th>samples/s</th>" + ("<th>replicas per worker</th>" if gang_training(views) else "<th></th>") + "</tr>"
                + "".join(rows) + "</table>"
            )
        else:
            self.header.text = f"<h3>Quiver: training <small>{title}</small></h3>" + (
                reported or "<p>No training branch has reported yet.</p>")


def training_doc(scheduler, extra, doc):
    _serve(TrainingPage(scheduler), "Quiver: Training", extra, doc)
