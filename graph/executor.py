"""Run a compiled exploration on a Dask cluster: the thin driver of the state machine.

Every decision (what to submit and with which priority, what to hold, release, cancel
or recompute, what each choose keeps, every branch's status, when to stop) is
:class:`graph.state.ExplorationState`'s; :class:`ExplorationDriver` only turns its
instructions into Client calls and the Client's callbacks into its events
(docs/architecture.md §4).

>>> from graph.compiler import compile_spec       # doctest: +SKIP
>>> record = execute(compile_spec(spec), client)  # doctest: +SKIP
>>> record.table.status.value_counts()            # doctest: +SKIP
"""

from __future__ import annotations

import logging
import queue
import time
import traceback as tb_module
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client, Future

from .compiler import CompiledPipeline
from .dashboard import ensure_dashboard
from .dashboard.protocol import ExplorationPublisher, TrainingWatch
from .errors import RunError
from .memory.budget import BudgetedRun
from .monitor import RunMonitor, snapshot_on_scheduler
from .progress import Progress
from .state import (
    Abort,
    Answer,
    Cancel,
    ChooseDecided,
    ExplorationState,
    Fail,
    FirstResult,
    Gather,
    MemoryPlanned,
    MetricRead,
    Publish,
    Release,
    Report,
    Start,
    Submit,
    TaskCancelled,
    TaskFailed,
    TaskFinished,
    Warn,
)
from .table import build_table
from .transform import prepare

__all__ = ["ExplorationDriver", "RunRecord", "execute"]

logger = logging.getLogger(__name__)


@dataclass
class RunRecord:
    """What a run produced: the table, the kept values (best first), and statistics."""

    table: Any
    values: list
    single: bool
    stats: dict = field(default_factory=dict)
    compiled: CompiledPipeline | None = None
    memory_plan: Any = None


class _Stopped(Exception):
    """The state machine said ``Fail``: the run ends with a ``RunError`` (and its table)."""


class ExplorationDriver:
    """Feeds one run's state machine from the Client and carries out its instructions.

    :meth:`abort` is thread-safe: a watchdog (or any other thread, or a Dask event
    handler) calls ``driver.abort(RunError("..."))`` and the run stops at its next step
    with that message, cancelling what it submitted.
    """

    def __init__(
        self,
        state: ExplorationState,
        client: Client,
        progress: Progress,
        *,
        publisher: ExplorationPublisher | None = None,
        budget: BudgetedRun | None = None,
        depth_first: bool = True,
        poll: float = 0.25,
        placement: dict[str, str] | None = None,
    ):
        self.state = state
        self.client = client
        self.progress = progress
        self.publisher = publisher
        self.budget = budget
        self.depth_first = depth_first  # False: no priorities, Dask's own ordering (for comparison)
        self.placement = dict(placement or {})  # task -> worker: loose restrictions (graph.packing.place_packs)
        self.poll = poll
        self.futures: dict[str, Future] = {}
        self.events: queue.Queue = queue.Queue()
        self.started: float | None = None  # the first submission
        self.ended: float | None = None  # the run's loop ended
        self.first_result: float | None = None  # seconds from the first submission to the first result
        self.first_rung: float | None = None  # seconds from the first submission to the first rung answer
        self.channel: Any = None  # graph.iterative.ReportChannel, when the run has iterative steps

    def open_reports(self) -> None:
        """Listen to the run's iterative steps (``graph.iterative.ReportChannel``): each
        report becomes a :class:`Report` event; the machine's :class:`Answer` goes back
        through the channel.  Close with :meth:`close_reports`."""
        if self.state.iterative and self.channel is None:
            from .iterative import ReportChannel

            self.channel = ReportChannel(self.client, self._on_report)

    def close_reports(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def _on_report(self, key: str, iteration: int, report: dict) -> None:
        self.events.put(Report(key, iteration, report))  # on the client's event loop: queue it only

    # ---- from other threads ------------------------------------------------------------------
    def abort(self, error: BaseException | str) -> None:
        """Stop the run with ``error``'s message (thread-safe; the run raises ``RunError``)."""
        self.events.put(Abort(str(error)))

    def _done_callback(self, fut: Future) -> None:
        self.events.put(fut.key)

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, *, sample_first: bool = False) -> None:
        """Run to the end (``sample_first``: the first branch alone, then the rest after
        :meth:`resume`). Raises ``_Stopped`` when the state machine says ``Fail``."""
        self.apply(self.state.handle(Start(first_only=sample_first)))
        until = (lambda: self.state.sampled) if sample_first else (lambda: self.state.finished_run)
        while not until():
            try:
                first = self.events.get(timeout=self.poll)
            except queue.Empty:
                self._show()
                continue
            batch = [first]
            while True:
                try:
                    batch.append(self.events.get_nowait())
                except queue.Empty:
                    break
            events = [e for e in map(self._event, batch) if e is not None]
            if events:
                self.apply(self.state.handle(*events))
            self._show()
        self.ended = time.perf_counter()
        self._show(force=True)

    def resume(self, droppable: frozenset | None = None) -> None:
        """After a sampling pass: install the plan's droppable keys and run the rest."""
        events: list = [MemoryPlanned(droppable)] if droppable is not None else []
        self.apply(self.state.handle(*events, Start()))
        self.run()

    def _event(self, item: Any) -> Any:
        """A Client callback's future (by name) as a state machine event."""
        if not isinstance(item, (str, tuple)):  # a future's key (a Dask partition's is a tuple)
            return item  # already an event (Abort)
        fut = self.futures.get(item)
        if fut is None:
            return None  # released or cancelled by the run meanwhile
        if fut.status == "finished":
            return TaskFinished(item)
        if fut.status == "error":
            exc = fut.exception()
            text = "".join(tb_module.format_exception(type(exc), exc, fut.traceback()))
            return TaskFailed(item, f"{type(exc).__name__}: {exc}", text)
        if fut.status == "cancelled":
            return TaskCancelled(item)
        return None

    def apply(self, instructions: list) -> None:
        """Carry out the state machine's instructions (and feed back what they produce)."""
        todo = list(instructions)
        decided = False
        while todo:
            ins = todo.pop(0)
            if isinstance(ins, Submit):
                self._submit(ins)
            elif isinstance(ins, Gather):
                futs = [self.futures[n] for n in ins.names]
                values = self.client.gather(futs)  # one round trip per batch
                todo.extend(self.state.handle(*(MetricRead(n, m, s) for n, (m, s) in zip(ins.names, values))))
            elif isinstance(ins, Answer):
                if self.first_rung is None:
                    self.first_rung = time.perf_counter() - (self.started or time.perf_counter())
                if self.channel is not None:
                    if ins.answer == "stop":
                        self.channel.stop(ins.name, ins.iteration)
                    else:
                        self.channel.resume(ins.name, ins.iteration)
            elif isinstance(ins, Release):
                for n in ins.names:
                    self.futures.pop(n, None)
            elif isinstance(ins, Cancel):
                futs = [self.futures.pop(n) for n in ins.names if n in self.futures]
                if futs:
                    self.client.cancel(futs)
            elif isinstance(ins, ChooseDecided):
                decided = True
            elif isinstance(ins, FirstResult):
                self.first_result = time.perf_counter() - (self.started or time.perf_counter())
                if self.budget is not None:
                    todo.extend(self._planned(self.budget.on_first_result(self.state.decisions())))
            elif isinstance(ins, Publish):
                if self.publisher is not None:
                    self.publisher.update(ins.branches, self.state.progress()["tasks_done"])
            elif isinstance(ins, Warn):
                self.progress.note(ins.message)
                if not self.progress.enabled:
                    logger.warning("quiver: %s", ins.message)
            elif isinstance(ins, Fail):
                raise _Stopped(ins.message)
            if not todo and decided and self.budget is not None:
                decided = False  # re-plan at most once per batch of decisions
                todo.extend(self._planned(self.budget.on_decision(self.state.decisions())))

    def _planned(self, droppable: frozenset | None) -> list:
        return [] if droppable is None else self.state.handle(MemoryPlanned(droppable))

    def _submit(self, ins: Submit) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        base = {"priority": dict(ins.priority).__getitem__} if self.depth_first else {}
        placed = {k: t for k, t in ins.tasks.items() if k in self.placement}
        rest = {k: t for k, t in ins.tasks.items() if k not in placed}
        layers = {}
        if rest:
            layers[f"quiver-{uuid.uuid4().hex[:8]}"] = MaterializedLayer(rest, annotations=base or None)
        if placed:  # packed tasks: each on its worker thread (anywhere, if that worker is gone)
            where = {**base, "workers": self.placement.__getitem__, "allow_other_workers": True}
            layers[f"quiver-{uuid.uuid4().hex[:8]}"] = MaterializedLayer(placed, annotations=where)
        hlg = HighLevelGraph(layers, {})
        hlg.dependencies = {name: set() for name in hlg.layers}
        for fut in self.client.get(hlg, list(ins.tasks), sync=False):
            self.futures[fut.key] = fut
            fut.add_done_callback(self._done_callback)

    def _show(self, force: bool = False) -> None:
        p = self.state.progress()
        if self.publisher is not None and (force or self.publisher.due()):
            self.publisher.update(self.state.changes(), p["tasks_done"], force)
        self.progress.update(**p, force=force)


def _busy_fraction(driver: ExplorationDriver, snap: dict, client: Client) -> float | None:
    """The worker threads' busy fraction over the run: the compute seconds the scheduler
    recorded (``startstops`` of every task of the run that finished or failed, as
    :class:`graph.monitor.RunMonitor` keeps them; a step waiting at a rung holds its thread
    and counts as busy) over (worker threads x seconds from the first submission to the end
    of the run).  Work lost with a killed worker is not counted.  ``None`` when unknown."""
    if driver.started is None or driver.ended is None:
        return None
    try:
        threads = sum(client.nthreads().values())
    except Exception:  # the cluster is going away: no figure rather than a wrong one
        return None
    span = driver.ended - driver.started
    if not threads or span <= 0:
        return None
    return min(1.0, sum(snap.get("seconds", {}).values()) / (threads * span))


def _iterative_stats(state: ExplorationState, driver: ExplorationDriver) -> dict:
    """``reports``, ``rungs`` (answers given), ``pruned_branches``, ``time_to_first_rung_s``
    (first submission to the first rung answer) and ``reports_replayed``."""
    return {
        "reports": state.report_count(),
        "rungs": state.rungs_answered,
        "pruned_branches": state.pruned_branches(),
        "time_to_first_rung_s": driver.first_rung,
        "reports_replayed": driver.channel.replayed if driver.channel is not None else 0,
    }


def execute(
    compiled: CompiledPipeline,
    client: Client,
    *,
    progress: bool | None = None,
    raise_if_all_failed: bool = True,
    store: Any = None,
    memory_budget: Any = None,
    sample_sizes: bool = False,
    order: str = "depth-first",
    disk_bandwidth: Any = None,
    on_metric_error: str = "stop",
    on_driver: Callable[[ExplorationDriver], Any] | None = None,
    stall_timeout: float | None = None,
    compute_value: bool = False,
) -> RunRecord:
    """Run ``compiled`` on ``client`` and return a :class:`RunRecord`.

    ``store``: a directory (or ``graph.store.ResultStore``) of results kept across runs.
    ``memory_budget``: total bytes for all workers (``"2 GiB"``): the run is planned
    (``graph.memory.plan``) and the plan installed on the workers (``graph.memory.budget``).
    ``sample_sizes``: run the first branch alone first and plan with its measured sizes.
    ``order``: ``"depth-first"`` (Quiver's priorities) or ``"dask"`` (Dask's own ordering).
    ``disk_bandwidth``: bytes/s the plan assumes for spilling (default: measured on a worker).
    ``on_metric_error``: ``"stop"`` ends the run when the first two branches at a choose
    fail to give their metric for the same reason; ``"continue"`` runs every branch.
    ``on_driver``: called with the :class:`ExplorationDriver` before anything is submitted
    (e.g. a watchdog that may call ``driver.abort(RunError(...))`` from its own thread); if
    it returns an object with ``close()`` (or ``cancel()``, e.g. a ``threading.Timer``), that is
    called when the run ends.
    ``stall_timeout``: seconds without progress (workers paused or gone, the scheduler silent)
    before the run stops with a ``RunError`` (``graph.watchdog``; ``None``/0: never).
    ``compute_value``: a kept value holding Dask collections is computed and gathered
    (default: its partitioned collections are persisted on the cluster; graph/collections.py).
    """
    if order not in ("depth-first", "dask"):
        raise ValueError(f"order must be 'depth-first' or 'dask', not {order!r}")
    start = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    prepared = prepare(compiled, store, run_id)  # graph/transform.py: the store, not-rerunnable steps
    compiled = prepared.compiled
    state = ExplorationState(compiled, on_metric_error=on_metric_error, publish=False)  # pulled when due
    monitor = RunMonitor(run_id, list(compiled.graph) + list(compiled.metric_graph))
    client.register_plugin(monitor)
    bar = Progress(enabled=progress)
    ensure_dashboard(client)  # the dashboard pages; the publisher sends them the branch states
    publisher = ExplorationPublisher(client, run_id, compiled, naive_tasks=prepared.naive_tasks, unique_tasks=prepared.unique_tasks)
    publisher.start()
    watch = TrainingWatch(client, bar)
    budgeted = None
    watcher = None
    snap: dict = {}
    sampler = None
    try:
        budgeted = BudgetedRun(client, memory_budget, sample=sample_sizes, run_id=run_id, disk_bandwidth=disk_bandwidth)
        driver = ExplorationDriver(
            state, client, bar, publisher=publisher, budget=budgeted, depth_first=order == "depth-first",
            placement=compiled.placement,
        )
        driver.open_reports()  # before anything is submitted: no report is missed
        if on_driver is not None:
            watcher = on_driver(driver)
        if stall_timeout:  # graph/watchdog.py: stop a stuck run with its cause, as an Abort event
            from .watchdog import Sampler

            sampler = Sampler(
                client, lambda reason: driver.abort(RunError(reason)), stall_timeout,
                progress=lambda: state.progress()["tasks_done"],
                reports=state.report_count,  # a reporting step is progress (Watchdog's docs)
            ).start()

        def snapshot() -> dict:
            return client.run_on_scheduler(snapshot_on_scheduler, name=monitor.name)

        sampled = []
        droppable = budgeted.start(
            compiled,
            monitor_name=monitor.name,
            snapshot=snapshot,
            abort=driver.abort,
            sample_first=lambda: sampled.append(driver.run(sample_first=True)),
        )
        if sampled:
            driver.resume(droppable)
        else:
            driver.apply(state.handle(MemoryPlanned(droppable)))
            driver.run()
        rows = state.rows()
        names = state.result_names()
        ok = [(rows[j].branch.key, name) for j, name in names.items()]
        gathered = client.gather([driver.futures[name] for _, name in ok]) if ok else []
        values = {key: v for (key, _), v in zip(ok, gathered)}
        lazy = [rows[j].branch for j in names if rows[j].branch.lazy is not None]
        if lazy:  # collections: persisted from the partitions the run holds (docs/architecture.md §8)
            from .collections import finish_value

            for b in lazy:
                values[b.key] = finish_value(client, b.lazy, values[b.key], compute_value)
        snap = snapshot()
        budget_stats = budgeted.stats(snap, compiled)
    except _Stopped as stop:  # the state machine ended the run (abort, the same metric mistake twice)
        rows = state.rows()
        table, _ = build_table(compiled, rows, {}, snap.get("seconds", {}))
        publisher.finish(rows, error=str(stop))
        raise RunError(str(stop), table=table) from None
    except BaseException as exc:  # the run stopped early: say so on the dashboard
        publisher.finish([], error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if "driver" in locals():  # first: a channel left open refuses the client's next run
            driver.close_reports()
        stop = getattr(watcher, "close", None) or getattr(watcher, "cancel", None)
        if stop is not None:
            stop()
        watch.close()
        if sampler is not None:  # graph/watchdog.py
            sampler.stop()
        if budgeted is not None:
            budgeted.close()
        bar.close()
        if "driver" in locals():
            driver.futures.clear()
        try:
            client.unregister_scheduler_plugin(monitor.name)
        except Exception:  # the scheduler may be gone; nothing left to clean
            pass
    table, kept = build_table(compiled, rows, values, snap.get("seconds", {}))
    if state.halving:
        table.attrs["rungs"] = state.rung_log()  # Result.rungs: every arrival at a rung, in order
    executed = snap.get("executed", {})
    stats = {
        "naive_tasks": prepared.naive_tasks,
        "unique_tasks": prepared.unique_tasks,
        "executed_tasks": sum(n for k, n in executed.items() if k in compiled.graph),
        "metric_tasks": sum(n for k, n in executed.items() if k in compiled.metric_graph),
        "branches": len(rows),
        "failed_branches": sum(r.status == "failed" for r in rows),
        "peak_memory_bytes": snap.get("peak_memory_bytes", 0),
        "peak_worker_memory_bytes": snap.get("peak_worker_memory_bytes", 0),
        "wall_seconds": time.perf_counter() - start,
        "first_result_seconds": driver.first_result,
    }
    stats["busy_fraction"] = _busy_fraction(driver, snap, client)
    if state.iterative:  # iterative steps and pruning (docs/architecture.md §7.2)
        stats.update(_iterative_stats(state, driver))
    stats.update(budget_stats)  # spilled/read-back bytes, recomputed tasks, plan vs measured
    stats.update(prepared.finish(client, executed))  # graph/transform.py: loads are not executions
    publisher.finish(rows, stats)  # final statuses for the dashboard
    if raise_if_all_failed and rows and all(r.status == "failed" for r in rows):
        first = rows[0]
        raise RunError(
            f"every branch failed ({len(rows)} of {len(rows)}); the first failed in step "
            f"{first.failed_step!r} with {first.error}. See the .table attribute of this "
            "error for each branch's error and traceback.",
            table=table,
        )
    return RunRecord(
        table=table,
        values=kept,
        single=compiled.single_value,
        stats=stats,
        compiled=compiled,
        memory_plan=budgeted.plan,
    )
