"""Quiver's pages in the Dask dashboard, served by the scheduler itself.

:class:`QuiverDashboard` is a ``SchedulerPlugin``. It keeps, per run, the explore/choose
tree with each branch's status, choices and metrics (fed by the run's
``quiver-exploration`` events) and, per training branch, the per-epoch curves that
``gpu.train``'s gang members publish on ``quiver-training`` (see :mod:`graph.dashboard.protocol`).
When it starts on a scheduler with a dashboard it adds, to that same HTTP server:

* ``/quiver-exploration``: the tree (colour = status, the chosen branch ringed) and a
  sortable table of the branches, updating live;
* ``/quiver-training``: live curves per training branch (accuracy and loss of the
  central model z, spread of the replicas around z, samples/s, replicas per worker and
  the auto-tuner's steps, sync vs compute seconds), and the report curves of the run's
  iterative steps (the choose metric per iteration, the pruning choose's rungs, an ``x``
  where a pruned branch stopped: docs/architecture.md §7);
* ``/quiver/api/state.json``: the same data as JSON (``?run=ID`` for one run);

and samples, every ``SAMPLE_SECONDS`` (0.5 s) while a run is in progress, each worker's
managed / unmanaged / spilled bytes and memory limit from Dask's own ``WorkerState.memory``
into the run's :class:`graph.memory.timeline.MemoryTimeline` (at most 2,000 samples, thinned
evenly): the exploration page's Memory panel, and ``result.stats["worker_memory"]``
(:func:`run_memory`);

and links the two pages from the dashboard's navigation bar.

``quiver`` runs register the plugin themselves (once per scheduler). For a scheduler
started by hand, load it at start so the pages exist before the first run::

    dask scheduler --preload graph.dashboard

>>> plugin = QuiverDashboard()
>>> plugin.log_event("quiver-exploration", {"kind": "start", "run": "r1", "name": "demo", "explores": ["a"],
...     "chooses": [{"index": 0, "metric": "x", "mode": "max"}],
...     "branches": [{"id": 0, "key": "k0", "choices": [["a", "one", {}]], "lineage": ["k0"], "gates": [[0, 0]]}]})
>>> plugin.log_event("quiver-exploration", {"kind": "end", "run": "r1", "branches": [{"id": 0, "status": "chosen", "metrics": {"x": 1.0}}]})
>>> run = plugin.snapshot()["runs"][0]
>>> run["state"], run["branches"][0]["status"], run["chosen"]
('finished', 'chosen', [0])
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .._dask import bokeh_prefix
from ..bounded import answered
from ..labels import branch_labels, choice_text
from ..memory.timeline import SAMPLE_SECONDS, MemoryTimeline, predicted_worker_peak
from ..spec import PruneSpec
from ..state.ranking import best as best_index
from ..state.status import live_status, stopped_status
from .protocol import (
    COLORS,
    EXPLORATION_PAGE,
    EXPLORATION_TOPIC,
    JSON_PATH,
    MAX_MEMORY_RUNS,
    MAX_RUNS,
    MAX_TRAININGS,
    PLUGIN_NAME,
    STATUSES,
    TRAINING_PAGE,
    TRAINING_TOPIC,
    jsonable,
)

__all__ = [
    "PLUGIN_NAME",
    "EXPLORATION_PAGE",
    "TRAINING_PAGE",
    "JSON_PATH",
    "QuiverDashboard",
    "dask_setup",
    "ensure_dashboard",
    "dashboard_snapshot",
    "run_memory",
    "worker_readings",
]

logger = logging.getLogger(__name__)



def _branch_label(b: dict) -> str:
    """``#3 width=64 lr=0.1``: a branch's id and the choices that tell it from the run's other
    branches (:func:`graph.labels.branch_labels`), as the pages name it."""
    return f"#{b['id']} {b['label']}" if b.get("label") else f"#{b['id']}"


def _extend_curve(curve: list, at: Any, points: list) -> None:
    """Put ``points`` at ``curve[at:]`` (a resent delta overwrites, a gap is padded with ``None``)."""
    at = at if isinstance(at, int) and at >= 0 else len(curve)
    curve.extend([None] * (at - len(curve)))
    curve[at : at + len(points)] = points


class QuiverDashboard(SchedulerPlugin):
    """Scheduler-side state of Quiver runs, and the pages that show it (see the module docs)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, max_runs: int = MAX_RUNS):
        self.max_runs = max_runs
        self.runs: OrderedDict[str, dict] = OrderedDict()
        self.training: OrderedDict[str, dict] = OrderedDict()
        self.version = 0
        self.scheduler = None
        self._sampler = None  # the periodic memory sampling (start/close)

    # ---- lifecycle -------------------------------------------------------------------------
    def __getstate__(self):
        return {"max_runs": self.max_runs}

    def __setstate__(self, state):
        self.__init__(**state)

    async def start(self, scheduler) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        try:
            install_pages(scheduler)
        except Exception:  # recorded: a scheduler without a dashboard still keeps the state (and the JSON)
            logger.info("quiver: could not add the dashboard pages", exc_info=True)
        self._sampler = PeriodicCallback(self.sample_memory, SAMPLE_SECONDS * 1000)
        self._sampler.start()

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    # ---- memory over time ----------------------------------------------------------------------
    def sample_memory(self, only: dict | None = None) -> None:
        """One memory sample of every worker, into each run in progress (``only``: that run)."""
        runs = [only] if only is not None else [r for r in self.runs.values() if r["state"] == "running"]
        runs = [r for r in runs if r["memory"] is not None]
        if self.scheduler is None or not runs:
            return
        readings = worker_readings(self.scheduler)
        now = time.monotonic()
        for run in runs:
            run["memory"].add(now, readings)

    def memory_view(self, run: dict) -> dict:
        """``{"timeline": MemoryTimeline.data(), "predicted_worker_peak": bytes or None,
        "plan_live": bool}``: the plan's prediction per worker, from the run's ``plan`` message
        (sent as each plan is made: ``plan_live``) or its final statistics."""
        timeline = run["memory"] if run["memory"] is not None else MemoryTimeline()  # older runs': let go
        data = timeline.data()
        plan = run.get("plan") or {}
        stats = run.get("stats") or {}
        predicted = plan.get("predicted_peak_bytes") or stats.get("predicted_peak_bytes")
        workers = plan.get("workers") or len(data["workers"])
        return {"timeline": data, "predicted_worker_peak": predicted_worker_peak(predicted, workers),
                "plan_live": bool(plan.get("predicted_peak_bytes"))}

    # ---- events ------------------------------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if topic == EXPLORATION_TOPIC:
            self._exploration(msg)
        elif topic == TRAINING_TOPIC:
            self._training(msg)

    def _exploration(self, msg: dict) -> None:
        kind, run_id = msg.get("kind"), msg.get("run")
        if kind == "start":
            # Thousands of branches share their choices, labels and upstream keys: one string
            # object per distinct value (``share``) keeps a run's record near 1 KB per branch.
            shared: dict = {}
            share = lambda v: shared.setdefault(v, v)  # noqa: E731
            branches = []
            for b in msg.get("branches", ()):
                choices = [(share(c[0]), share(c[1]), c[2] or {}) for c in b.get("choices", ())]
                label = b.get("label")
                branches.append(
                    {
                        "id": b["id"],
                        "key": share(b.get("key")),
                        "choices": {name: share(choice_text(alt, params)) for name, alt, params in choices},
                        "labels": {name: alt for name, alt, _ in choices},
                        "label": label,
                        "_choices": choices if label is None else None,  # to label it below (an older publisher)
                        "params": {share(f"{name}.{p}"): v for name, _, params in choices for p, v in params.items()},
                        "lineage": [share(k) for k in b.get("lineage", ())],
                        "gates": b.get("gates", []),
                        "status": "waiting",
                        "metrics": {},
                        "scalars": {},
                        "error": None,
                    }
                )
            if any(b["_choices"] is not None for b in branches):
                for b, text in zip(branches, branch_labels([b["_choices"] or () for b in branches])):
                    b["label"] = b["label"] or text
            for b in branches:
                del b["_choices"]
            if self.training:
                # a rerun of the same pipeline reuses the training step's key: its curves
                # start afresh for the new run (a gang restart keeps them: it sends no "start" here)
                for key in {k for b in branches for k in b["lineage"]}:
                    self.training.pop(key, None)
            self.runs[run_id] = {
                "run": run_id,
                "name": msg.get("name", "pipeline"),
                "started": msg.get("time", time.time()),
                "finished": None,
                "state": "running",
                "explores": msg.get("explores", []),
                "chooses": msg.get("chooses", []),
                "branches": branches,
                "unique_tasks": msg.get("unique_tasks"),
                "naive_tasks": msg.get("naive_tasks"),
                "total_branches": msg.get("total_branches", len(branches)),
                "tasks_done": 0,
                "stats": {},
                "error": None,
                "key_index": None,  # task key -> branch ids, built when a training page asks (branches_of)
                "curve_choose": msg.get("curve_choose"),  # the choose whose metric the report curves show
                "memory": _new_timeline(),
                "plan": None,
            }
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
            for old in list(self.runs.values())[:-MAX_MEMORY_RUNS]:  # older runs: their samples go
                old["memory"] = None
            self.sample_memory(only=self.runs[run_id])  # the first sample: before anything ran
        elif kind == "plan":  # a memory plan for the run: its predicted peak (and the workers it splits over)
            run = self.runs.get(run_id)
            if run is not None:
                run["plan"] = {k: msg.get(k) for k in ("predicted_peak_bytes", "workers")}
        elif kind in ("update", "end"):
            run = self.runs.get(run_id)
            if run is None:
                return
            for u in msg.get("branches", ()):
                i = u.get("id")
                if not isinstance(i, int) or not 0 <= i < len(run["branches"]):
                    continue
                b = run["branches"][i]
                if u.get("status") in STATUSES:
                    b["status"] = u["status"]
                b["metrics"].update(u.get("metrics") or {})
                b["scalars"].update(u.get("scalars") or {})
                if u.get("error"):
                    b["error"] = u["error"]
                if isinstance(u.get("story"), (list, tuple)):  # a failed branch's last handlings (end)
                    b["story"] = [e for e in u["story"] if isinstance(e, dict)]
                if "iterations" in u:  # an iterative step's reports (docs/architecture.md §7)
                    b["iterations"], b["pruned_at"] = u["iterations"], u.get("pruned_at")
                if isinstance(u.get("curve"), (list, tuple)):  # new points of its report curve (msgpack: a tuple)
                    _extend_curve(b.setdefault("curve", []), u.get("curve_at", 0), list(u["curve"]))
            if "tasks_done" in msg:
                run["tasks_done"] = msg["tasks_done"]
            if kind == "end":
                if run["state"] == "running":
                    self.sample_memory(only=run)  # the last sample: as the run ends
                if msg.get("error"):  # stopped early: what had not finished never will
                    for b in run["branches"]:
                        b["status"] = stopped_status(b["status"])
                run["state"] = "failed" if msg.get("error") else "finished"
                run["finished"] = msg.get("time", time.time())
                run["stats"] = msg.get("stats") or {}
                run["error"] = msg.get("error")
        self.version += 1

    def _training(self, msg: dict) -> None:
        task = str(msg.get("task"))
        rec = self.training.get(task)
        if rec is None:
            rec = self.training[task] = {
                "task": task,
                "started": time.time(),
                "state": "running",
                "algorithm": None,
                "epochs_total": None,
                "config": {},
                "epochs": {},
                "workers": {},
                "tuning": [],
                "size": msg.get("size", 1),
                "accuracy": None,
            }
            while len(self.training) > MAX_TRAININGS:
                self.training.popitem(last=False)
        kind = msg.get("kind")
        worker = msg.get("worker")
        rec["size"] = msg.get("size", rec["size"])
        if kind == "start":
            rec["state"] = "running"
            rec["algorithm"] = msg.get("algorithm")
            rec["epochs_total"] = msg.get("epochs")
            rec["config"] = {k: msg[k] for k in ("lr", "batch_size", "replicas", "algorithm") if k in msg}
        elif kind == "epoch":
            if worker:
                rec["workers"][worker] = msg.get("replicas")
            if msg.get("rank", 0) == 0:
                fields = (
                    "epoch", "accuracy", "test_loss", "train_loss", "spread", "samples_per_s",
                    "compute_s", "sync_s", "replicas", "lr", "elapsed_s",
                )
                rec["epochs"][int(msg.get("epoch", len(rec["epochs"]) + 1))] = {f: msg.get(f) for f in fields}
                rec["accuracy"] = msg.get("accuracy")
                rec["epochs_total"] = msg.get("epochs", rec["epochs_total"])
        elif kind == "tuning":
            if msg.get("rank", 0) == 0:
                rec["tuning"] = [list(p) for p in msg.get("tuning", ())]
        elif kind == "end":
            if msg.get("rank", 0) == 0:
                rec["state"] = "done"
        self.version += 1

    # ---- views -------------------------------------------------------------------------------
    def _live_status(self, b: dict) -> str:
        """A running branch with the scheduler's own task states (the rule: ``graph.state.status.live_status``)."""
        status = b["status"]
        if status != "running" or self.scheduler is None:
            return status
        tasks = self.scheduler.tasks
        processing = any((ts := tasks.get(key)) is not None and ts.state == "processing" for key in b["lineage"])
        return live_status(status, processing)

    def branches_of(self, task: str) -> list[tuple[str, int]]:
        """``(run, branch id)`` of every branch whose path contains the task ``task``, oldest run first."""
        out = []
        for run_id, run in self.runs.items():
            index = run.get("key_index")
            if index is None:  # built once per run, and only when asked: a run without training never pays
                index = run["key_index"] = {}
                for b in run["branches"]:
                    for key in b["lineage"]:
                        index.setdefault(key, []).append(b["id"])
            out.extend((run_id, i) for i in index.get(task, ()))
        return out

    def _status(self, run: dict, b: dict) -> str:
        return self._live_status(b) if run["state"] == "running" else b["status"]

    def run_view(self, run: dict) -> dict:
        branches = []
        for b in run["branches"]:
            branches.append(
                {
                    "id": b["id"],
                    "status": self._status(run, b),
                    "choices": dict(b["choices"]),
                    "labels": dict(b["labels"]),
                    "label": b.get("label") or "",
                    "params": jsonable(b["params"]),
                    "metrics": dict(b["metrics"]),
                    "scalars": dict(b["scalars"]),
                    "error": b["error"],
                    "story": list(b.get("story") or ()),
                    "key": b["key"],
                    "iterations": b.get("iterations"),
                    "pruned_at": b.get("pruned_at"),
                    "last_report": b["curve"][-1] if b.get("curve") else None,  # the curve metric's latest
                }
            )
        counts = {s: 0 for s in STATUSES}
        for b in branches:
            counts[b["status"]] = counts.get(b["status"], 0) + 1
        best = None
        if run["chooses"]:
            cp = run["chooses"][-1]
            metrics = {b["id"]: b["metrics"].get(cp["metric"]) for b in branches}
            metrics = {i: float(m) for i, m in metrics.items() if isinstance(m, (int, float))}
            pick = best_index(metrics, cp.get("mode", "max"))  # the choose's own rule (graph.state.ranking)
            if pick is not None:
                best = {"metric": cp["metric"], "value": metrics[pick], "branch": pick}
        return {
            "run": run["run"],
            "name": run["name"],
            "state": run["state"],
            "started": run["started"],
            "finished": run["finished"],
            "explores": run["explores"],
            "chooses": run["chooses"],
            "counts": counts,
            "branches": branches,
            "chosen": [b["id"] for b in branches if b["status"] == "chosen"],
            "total_branches": run.get("total_branches", len(branches)),
            "best": best,
            "tasks_done": run["tasks_done"],
            "unique_tasks": run["unique_tasks"],
            "naive_tasks": run["naive_tasks"],
            "stats": run["stats"],
            "error": run["error"],
        }

    def curves_view(self, run: dict) -> dict | None:
        """The report curves of ``run``'s iterative steps (docs/architecture.md §7), or ``None``:
        ``{"metric", "mode", "rungs", "branches": [{"id", "label", "status", "curve", "pruned_at"}]}``
        (``curve[i]``: the metric of report ``i + 1``; ``rungs``: the pruning choose's rung
        iterations up to the longest curve, ``PruneSpec.rungs``).  Only branches with reports."""
        ci = run.get("curve_choose")
        cp = next((c for c in run["chooses"] if c.get("index") == ci), None)
        branches = [b for b in run["branches"] if b.get("curve")]
        if cp is None or not branches:
            return None
        longest = max(len(b["curve"]) for b in branches)
        prune = cp.get("prune")
        rungs = list(PruneSpec(**prune).rungs(longest)) if isinstance(prune, dict) else []
        return {
            "metric": cp.get("metric"),
            "mode": cp.get("mode", "max"),
            "rungs": rungs,
            "branches": [
                {
                    "id": b["id"],
                    "label": _branch_label(b),
                    "status": self._status(run, b),
                    "curve": list(b["curve"]),
                    "pruned_at": b.get("pruned_at"),
                }
                for b in branches
            ],
        }

    def training_view(self, rec: dict) -> dict:
        refs = self.branches_of(rec["task"])
        if refs:  # the newest run that has this training step
            newest = refs[-1][0]
            refs = [r for r in refs if r[0] == newest]
        labels = []
        for run_id, i in refs:
            run = self.runs.get(run_id)
            if run is not None:
                labels.append(_branch_label(run["branches"][i]))
        return {
            "task": rec["task"],
            "run": refs[0][0] if refs else None,
            "branches": [i for _, i in refs],
            "label": "; ".join(labels) if labels else rec["task"],
            "state": rec["state"],
            "algorithm": rec["algorithm"],
            "config": rec["config"],
            "epochs_total": rec["epochs_total"],
            "epochs": [rec["epochs"][e] for e in sorted(rec["epochs"])],
            "workers": dict(rec["workers"]),
            "tuning": list(rec["tuning"]),
            "size": rec["size"],
            "accuracy": rec["accuracy"],
        }

    def snapshot(self, run: str | None = None) -> dict:
        """Everything the pages show, as plain JSON data (``run``: only that run and its training)."""
        runs = [dict(self.run_view(r), curves=self.curves_view(r), memory=self.memory_view(r))
                for r in self.runs.values() if run is None or r["run"] == run]
        training = [self.training_view(t) for t in self.training.values()]
        if run is not None:
            training = [t for t in training if t["run"] == run]
        return jsonable({"version": self.version, "time": time.time(), "runs": runs, "training": training})


def dashboard_snapshot(dask_scheduler, run: str | None = None) -> dict:
    """``client.run_on_scheduler(dashboard_snapshot)``: the plugin's snapshot (``{}`` without it)."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin.snapshot(run) if plugin is not None else {}


def _new_timeline() -> MemoryTimeline:
    """A run's timeline, with Dask's pause and spill thresholds (this scheduler's config) to draw."""
    from ..memory.limits import dask_thresholds

    try:
        t = dask_thresholds()
    except ValueError as exc:  # recorded: a bad threshold in the config; the lines are left out
        logger.info("quiver: memory thresholds not drawn: %s", exc)
        return MemoryTimeline()
    on = lambda v: float(v) if v is not False and v is not None else None  # noqa: E731
    return MemoryTimeline(pause=on(t.pause), spill=on(t.spill))


def worker_readings(scheduler) -> dict[str, tuple[int, int, int, int]]:
    """``{worker address: (managed, unmanaged, spilled, memory_limit)}`` from Dask's own
    ``WorkerState.memory`` (``distributed.scheduler.MemoryState``), as the scheduler sees it now."""
    out = {}
    for address, ws in scheduler.workers.items():
        m = ws.memory
        out[address] = (m.managed, m.unmanaged, m.spilled, ws.memory_limit or 0)
    return out


def _memory_of_run(dask_scheduler, run_id: str) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    run = plugin.runs.get(run_id) if plugin is not None else None
    return jsonable(plugin.memory_view(run)) if run is not None else None


def run_memory(client, run_id: str, timeout: float = 10.0) -> dict | None:
    """After a run: the memory samples of run ``run_id`` (``RunRecord.run_id``), as
    :meth:`QuiverDashboard.memory_view` gives them, or ``None`` (no plugin, no such run, or no
    answer within ``timeout`` s: a report without the chart, never a failed run)."""
    try:
        return client.run_on_scheduler(_memory_of_run, run_id=run_id, callback_timeout=timeout)
    except Exception as exc:  # recorded: a report without the memory chart rather than a failed run
        logger.debug("quiver: memory samples not read: %s", exc)
        return None


def ensure_dashboard(client) -> bool:
    """Register :class:`QuiverDashboard` on ``client``'s scheduler unless it is there (idempotent).

    Returns whether the plugin is present afterwards; never raises (the pages are a view).
    """
    try:
        answered(client.register_plugin, QuiverDashboard(), what="registering the dashboard's plugin")
        return True
    except Exception as exc:  # recorded: the pages are a view, a run goes on without them
        logger.info("quiver: dashboard plugin not registered: %s", exc)
        return False


def dask_setup(scheduler) -> None:
    """Preload hook: ``dask scheduler --preload graph.dashboard`` adds the plugin and its pages."""
    scheduler.add_plugin(QuiverDashboard(), name=PLUGIN_NAME, idempotent=True)


# ---- HTTP: the JSON endpoint and the Bokeh pages ---------------------------------------------------
def _json_handler():
    from distributed.http.utils import RequestHandler

    class QuiverStateHandler(RequestHandler):
        def get(self):
            plugin = self.server.plugins.get(PLUGIN_NAME)
            run = self.get_argument("run", None)
            data = plugin.snapshot(run) if plugin is not None else {"runs": [], "training": []}
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(data))

    return QuiverStateHandler


def install_pages(scheduler) -> bool:
    """Add the JSON route and (when the scheduler has a Bokeh dashboard) the two pages. Once per scheduler."""
    if getattr(scheduler, "_quiver_pages", False):
        return True
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    from tornado import web
    from tornado.ioloop import IOLoop

    bokeh_apps = [a for a in app.applications if hasattr(a, "app_paths")]
    prefix = bokeh_prefix(bokeh_apps[0]) if bokeh_apps else ""
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    handler = _json_handler()
    app.add_application(web.Application([(prefix + JSON_PATH, handler, {"dask_server": scheduler})]))
    scheduler._quiver_pages = True
    if not bokeh_apps:
        return True
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables

    from . import pages as dashboard_pages

    variables = template_variables(scheduler)  # shared with the dashboard's own pages: they link ours too
    for page in (EXPLORATION_PAGE, TRAINING_PAGE):
        if page not in variables["pages"]:
            variables["pages"].append(page)
    pages = {"/" + EXPLORATION_PAGE: dashboard_pages.exploration_doc, "/" + TRAINING_PAGE: dashboard_pages.training_doc}
    bokeh_app = BokehApplication(pages, scheduler, prefix=prefix, template_variables=variables)
    app.add_application(bokeh_app)
    bokeh_app.initialize(IOLoop.current())
    bokeh_app.start()
    return True
