"""What a run tells the cluster while it runs: Dask events the Quiver dashboard plugin reads.

A run publishes on two topics with Dask's own event log (``Client.log_event`` on the
client, ``Worker.log_event`` inside tasks); the scheduler hands every event to its
plugins, so :class:`graph.dashboard.QuiverDashboard` sees them, and Dask's own
"Events" page lists them too.

* ``quiver-exploration`` (the client side of a run, :class:`ExplorationPublisher`):
  ``{"kind": "start", ...}`` with the branches (choices, keys, ``label``: the choices that
  differ between the branches, :mod:`graph.labels`) and the chooses, then
  ``{"kind": "update", ...}`` with the branches whose status or metric changed
  (throttled), then ``{"kind": "end", ...}`` with every branch's final status (a failed
  branch's with its ``story``: the state machine's last handlings that name its tasks, each
  ``{"stimulus", "events", "instructions"}``).
  A run with iterative steps (docs/architecture.md §7) adds, per changed branch,
  ``iterations`` and ``pruned_at``, and its report curve as a delta: ``curve`` (the values of
  the ``curve_choose`` metric, named in ``start``, that were not sent before) starting at
  report ``curve_at`` (0-based), so a branch's points travel once whatever the throttle;
  ``start`` gives each choose's ``prune`` (``factor``, ``min_iter``, ``max_iter``) for the rungs.
  ``{"kind": "plan", "run", "predicted_peak_bytes", "workers"}`` gives the run's memory plan, drawn
  on the Memory panel before the run ends (without it, the plan's line comes from ``end``'s ``stats``).
* ``quiver-training`` (each member of a ``gpu.train`` gang): ``start``, one ``epoch``
  record per epoch (accuracy and loss of z, replica spread, samples/s, replicas,
  sync and compute seconds), ``tuning`` (the auto-tuner's curve) and ``end``.

Branch statuses (:mod:`graph.state.status`): ``waiting``, ``running``, ``done`` (its metric or
value is in), ``failed``, ``dropped`` (lost a choose), ``pruned`` (stopped mid-training by a
pruning choose), ``cancelled``, ``chosen``.

>>> jsonable({"a": float("nan"), "b": (1, 2.5), 3: "x"})
{'a': None, 'b': [1, 2.5], '3': 'x'}
>>> final_status("ok", chosen=True), final_status("ok", chosen=False), final_status("pruned", chosen=False)
('chosen', 'done', 'pruned')
"""

from __future__ import annotations

import logging
import math
import numbers
import queue
import threading
import time
from typing import Any

from ..labels import branch_labels
from ..state.halving import curve_choose
from ..state.status import COLORS, STATUSES, final_status  # their one owner; re-exported here

__all__ = [
    "COLORS",
    "EXPLORATION_PAGE",
    "JSON_PATH",
    "PLUGIN_NAME",
    "TRAINING_PAGE",
    "EXPLORATION_TOPIC",
    "TRAINING_TOPIC",
    "STATUSES",
    "ExplorationPublisher",
    "TrainingWatch",
    "final_status",
    "jsonable",
]

logger = logging.getLogger(__name__)

# The scheduler plugin's name, its pages and JSON route.
PLUGIN_NAME = "quiver-dashboard"
EXPLORATION_PAGE = "quiver-exploration"
TRAINING_PAGE = "quiver-training"
JSON_PATH = "quiver/api/state.json"
MAX_RUNS = 20
MAX_MEMORY_RUNS = 5  # the newest runs whose memory samples the plugin keeps (graph.memory.timeline)
MAX_TRAININGS = 200

EXPLORATION_TOPIC = "quiver-exploration"
TRAINING_TOPIC = "quiver-training"  # gpu/training.py publishes under the same name (gpu cannot import graph)
MAX_PUBLISHED_BRANCHES = 10000  # past this, a run publishes its summary only (events stay small)
MAX_QUEUED = 8  # messages waiting for the sender thread; past this, updates are dropped


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON/msgpack data: NaN and infinities become ``None``, other objects ``str``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    if depth > 10:  # the JSON state's deepest: runs / branches / story / events
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if callable(value):
        from ..spec import fn_name

        return fn_name(value)
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _pipeline_name(spec: Any) -> str:
    from ..spec import pipeline_name

    try:
        return pipeline_name(spec)
    except (AttributeError, IndexError, TypeError):  # not a pipeline's spec (a test's stand-in): a generic name
        return "pipeline"


def _prune_info(prune: Any) -> dict | None:
    if prune is None:
        return None
    return {"factor": prune.factor, "min_iter": prune.min_iter, "max_iter": prune.max_iter}


def _branch_info(i: int, branch: Any, label: str | None = None) -> dict:
    """A branch as ``start`` sends it: its choices with each parameter's plain value or short
    text (:func:`graph.labels.plain_value`: ``make_net(64)``, never an address) and ``label``,
    its choices that differ from the other branches' (:func:`graph.labels.branch_labels`)."""
    from ..labels import plain_value

    info = {
        "id": i,
        "key": branch.key,
        "choices": [[name, alt, {str(p): jsonable(plain_value(v)) for p, v in params}]
                    for name, alt, params in branch.choice_items],
        "lineage": list(branch.lineage),
        "gates": [list(g) for g in branch.gates],
    }
    if label is not None:
        info["label"] = label
    return info


class ExplorationPublisher:
    """Publishes one run's branch states on ``quiver-exploration`` (never raises into the run,
    never blocks it).

    ``Client.log_event`` waits for the scheduler's answer, with no timeout: the messages go
    through a queue to a sender thread of their own.  While the queue is full (the scheduler
    is slow or silent) changed branches wait in the next update, and a message that still
    finds it full is dropped (``dropped`` counts them) rather than make the run wait.  :meth:`finish` waits at most ``timeout`` seconds for the last message.

    >>> pub = ExplorationPublisher(None, "run-1", None)   # no client: publishes nothing
    >>> pub.enabled
    False
    """

    def __init__(
        self,
        client: Any,
        run_id: str,
        compiled: Any,
        *,
        interval: float = 0.5,
        share: float = 0.02,
        clock: Any = None,
        naive_tasks: int | None = None,
        unique_tasks: int | None = None,
    ):
        self.client = client
        # the user's pipeline's task counts (a store-transformed pipeline has fewer)
        self.naive_tasks = naive_tasks if naive_tasks is not None else (compiled.naive_tasks if compiled else 0)
        self.unique_tasks = unique_tasks if unique_tasks is not None else (compiled.unique_tasks if compiled else 0)
        self.run_id = run_id
        self.compiled = compiled
        self.interval = interval  # the shortest gap between two updates, in seconds
        # Reading every branch's state costs O(branches) on the client, which shares the cores
        # with the scheduler and the workers: after an update that took t seconds the next one
        # waits at least t / share, so publishing stays below ``share`` of the run's time.
        self.share = share
        self.clock = clock or time.perf_counter
        self._gap = interval
        self.enabled = client is not None and compiled is not None
        self.detailed = self.enabled and len(compiled.branches) <= MAX_PUBLISHED_BRANCHES
        self._pending: dict[int, dict] = {}
        self._curve_sent: dict[int, int] = {}  # branch -> report-curve points already sent
        self._tasks_done = 0
        self._last = 0.0
        self.dropped = 0  # messages not sent because the queue was full
        self._queue: queue.Queue = queue.Queue(MAX_QUEUED)
        self._sender: threading.Thread | None = None

    def memory_plan(self, plan: Any) -> None:
        """A memory plan for this run (the first or a re-plan): the memory panel draws its
        predicted peak per worker while the run goes on. Queued like every message (never waits)."""
        self._send({"kind": "plan", "run": self.run_id, "predicted_peak_bytes": int(plan.predicted_peak),
                    "workers": int(plan.workers)})

    def _send(self, msg: dict, last: bool = False) -> None:
        """Queue ``msg`` for the sender thread; drop it when the queue is full (never wait).
        ``last``: the end message, for which a queued update is dropped to make room."""
        if not self.enabled:
            return
        if self._sender is None:
            self._sender = threading.Thread(target=self._deliver, name="quiver-publisher", daemon=True)
            self._sender.start()
        if last and self._queue.full():
            try:
                self._queue.get_nowait()
                self.dropped += 1
            except queue.Empty:  # the sender took one meanwhile: there is room
                pass
        try:
            self._queue.put_nowait(msg)
        except queue.Full:
            self.dropped += 1

    def _deliver(self) -> None:
        """The sender thread: one ``log_event`` at a time, until ``None``."""
        while True:
            msg = self._queue.get()
            if msg is None:
                return
            try:
                self.client.log_event(EXPLORATION_TOPIC, msg)
            except Exception as exc:  # recorded: the dashboard is a view, a run never fails because of it
                logger.debug("quiver: cannot publish exploration event: %s", exc)
                self.enabled = False
                return

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the sender thread once what is queued is sent, waiting at most ``timeout`` s;
        returns whether everything queued was sent."""
        if self._sender is None:
            return True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:  # the sender is stuck on a silent scheduler
            return False
        self._sender.join(max(0.0, deadline - time.monotonic()))
        return not self._sender.is_alive()

    def start(self) -> None:
        c = self.compiled
        if not self.enabled:
            return
        self._send(
            {
                "kind": "start",
                "run": self.run_id,
                "name": _pipeline_name(c.output),
                "time": time.time(),
                "explores": list(c.explore_names),
                "chooses": [
                    {
                        "index": cp.index,
                        "metric": cp.spec.metric_name,
                        "mode": cp.spec.mode,
                        "k": cp.spec.k,
                        "threshold": jsonable(cp.spec.threshold),
                        "per": cp.spec.per,
                        "prune": _prune_info(cp.spec.prune),
                    }
                    for cp in c.chooses
                ],
                "curve_choose": curve_choose(c.chooses),
                "branches": [_branch_info(i, b, text) for i, (b, text) in
                             enumerate(zip(c.branches, branch_labels([b.choice_items for b in c.branches])))]
                if self.detailed else [],
                "total_branches": len(c.branches),
                "unique_tasks": self.unique_tasks,
                "naive_tasks": self.naive_tasks,
            }
        )

    def due(self) -> bool:
        """Whether an update would be sent now (at most every ``interval`` s)."""
        return self.enabled and self.detailed and self.clock() - self._last >= self._gap

    def update(self, branches: Any = (), tasks_done: int | None = None, force: bool = False) -> None:
        """Queue changed branches (``(id, status, metrics, error)`` rows, what the state machine's
        ``Publish`` instruction carries) and send what is queued at most every ``interval`` s."""
        if not self.enabled or not self.detailed:
            return
        for row in branches:
            i, status, metrics, error = row[:4]
            self._pending[i] = {"id": i, "status": status, "metrics": jsonable(metrics), "error": error}
            if len(row) > 4:  # iterative steps: reports made, the iteration a pruning choose stopped it at
                self._pending[i]["iterations"], self._pending[i]["pruned_at"] = row[4], row[5]
            if len(row) > 6:  # and its report curve, whole here: cut to what is new when sent
                self._pending[i]["curve"] = row[6]
        if tasks_done is not None:
            self._tasks_done = tasks_done
        now = self.clock()
        if not self._pending or (not force and now - self._last < self._gap):
            return
        if self._queue.full():  # the sender is behind (a slow or silent scheduler): keep them for a later update
            return
        changed, self._pending = list(self._pending.values()), {}
        for entry in changed:
            if "curve" in entry:
                self._curve_delta(entry)
        self._send({"kind": "update", "run": self.run_id, "branches": changed, "tasks_done": self._tasks_done})
        self._last = self.clock()
        self._gap = max(self.interval, (self._last - now) / self.share)

    def _curve_delta(self, entry: dict) -> None:
        """Replace a branch's whole curve by the points not sent yet (``curve``, ``curve_at``)."""
        curve = entry.pop("curve")
        sent = self._curve_sent.get(entry["id"], 0)
        if len(curve) > sent:
            entry["curve"], entry["curve_at"] = jsonable(list(curve[sent:])), sent
            self._curve_sent[entry["id"]] = len(curve)

    def finish(self, rows: list, stats: dict | None = None, error: str | None = None, timeout: float = 10.0,
               stories: dict[int, list] | None = None) -> None:
        """Send every branch's final status (``rows``: the executor's ``RowState`` list) and
        close the sender, waiting at most ``timeout`` s (queued updates make room for it).
        ``stories``: failed branches' last handlings of the state machine
        (``ExplorationState.failure_stories``), shown beside their error."""
        branches = []
        for i, r in enumerate(rows if self.detailed else ()):
            metrics = {
                self.compiled.chooses[ci].spec.metric_name: jsonable(m) for ci, m in r.metrics if m is not None
            }
            branches.append(
                {
                    "id": i,
                    "status": final_status(r.status, r.chosen),
                    "metrics": metrics,
                    "scalars": jsonable({k: v for k, v in (r.scalars or {}).items()}),
                    "error": r.error,
                }
            )
            if r.iterations is not None:
                branches[-1]["iterations"], branches[-1]["pruned_at"] = r.iterations, r.pruned_at
            if stories and stories.get(i):
                branches[-1]["story"] = jsonable(stories[i])
        self._send(
            {
                "kind": "end",
                "run": self.run_id,
                "time": time.time(),
                "branches": branches,
                "stats": jsonable(stats or {}),
                "error": error,
            },
            last=True,
        )
        self.close(timeout)


class TrainingWatch:
    """Shows the latest training epoch of a run on its terminal progress line.

    Subscribes to ``quiver-training`` on ``client`` only when ``progress`` is enabled (a
    terminal, or asked for), and writes e.g. ``train epoch 3/5 acc 0.941 5,210 samples/s``
    into ``progress.extra``.

    >>> from graph.report.progress import Progress
    >>> bar = Progress(enabled=False)
    >>> w = TrainingWatch(None, bar)
    >>> w.on_event((0.0, {"kind": "epoch", "rank": 0, "epoch": 2, "epochs": 5, "accuracy": 0.9, "samples_per_s": 1200.0}))
    >>> bar.extra
    'train epoch 2/5 acc 0.900 1,200 samples/s'
    >>> w.close()
    """

    def __init__(self, client: Any, progress: Any):
        self.client = client
        self.progress = progress
        self.subscribed = False
        if client is not None and getattr(progress, "enabled", False):
            try:
                client.subscribe_topic(TRAINING_TOPIC, self.on_event)
                self.subscribed = True
            except Exception as exc:  # recorded: the terminal line is a view, the run goes on without it
                logger.debug("quiver: cannot subscribe to training events: %s", exc)

    def on_event(self, event: Any) -> None:
        try:
            _, msg = event
            if msg.get("rank", 0) != 0:
                return
            if msg.get("kind") == "epoch":
                total = msg.get("epochs")
                acc = msg.get("accuracy")
                sps = msg.get("samples_per_s")
                text = f"train epoch {msg.get('epoch')}" + (f"/{total}" if total else "")
                if acc is not None:
                    text += f" acc {acc:.3f}"
                if sps is not None:
                    text += f" {sps:,.0f} samples/s"
                self.progress.extra = text
            elif msg.get("kind") == "tuning" and msg.get("tuning"):
                k, rate = msg["tuning"][-1]
                self.progress.extra = f"train tuning: {k} replicas/worker {rate:,.0f} samples/s"
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a malformed event: never break the event loop
            logger.debug("quiver: malformed training event %r: %s", event, exc)

    def close(self) -> None:
        if self.subscribed:
            try:
                self.client.unsubscribe_topic(TRAINING_TOPIC)
            except Exception as exc:  # recorded: a closed client has nothing to unsubscribe
                logger.debug("quiver: cannot unsubscribe from training events: %s", exc)
            self.subscribed = False
