"""Run a compiled exploration on a Dask cluster: the thin driver of the state machine.

Every decision (what to submit and with which priority, what to hold, release, cancel
or recompute, what each choose keeps, every branch's status, when to stop) is
:class:`graph.state.ExplorationState`'s; :class:`ExplorationDriver` only turns its
instructions into Client calls and the Client's callbacks into its events
(docs/architecture.md §4).

>>> from graph.compiling.compiler import compile_spec       # doctest: +SKIP
>>> record = execute(compile_spec(spec), client)  # doctest: +SKIP
>>> record.table.status.value_counts()            # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
import traceback as tb_module
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client, Future

from .._dask import future_status_change
from ..bounded import CLEANUP_SECONDS, Interrupted, NoAnswer, in_thread, wait, within
from ..compiling.compiler import CompiledPipeline, reads_for_run
from ..compiling.transform import prepare
from ..dashboard import ensure_dashboard
from ..dashboard.protocol import ExplorationPublisher, TrainingWatch
from ..errors import BranchFailureWarning, RunError
from ..memory.budget import BudgetedRun
from ..parcels import RETRY_TOPIC, opened, retries_by_key, set_client_process
from ..report.progress import Progress
from ..report.table import build_table
from ..state import (
    Abort,
    Answer,
    Cancel,
    ChooseDecided,
    ExplorationState,
    Fail,
    Finished,
    FirstResult,
    Gather,
    MemoryPlanned,
    MetricRead,
    MetricSent,
    Release,
    Replan,
    Report,
    Start,
    Submit,
    TaskCancelled,
    TaskFailed,
    TaskFinished,
    TaskLost,
    Warn,
    Watch,
)
from ..state.failures import every_branch_failed, failed_everywhere, failure_kind
from .monitor import RunMonitor, snapshot_on_scheduler
from .options import RunOptions, check_options, takes_run_options

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
    run_id: str = ""  # the run's name on the scheduler (its dashboard page, its memory samples)
    client: Any = None  # the cluster persisted collections live on (graph.run.session), else None
    close: Any = None  # closes an embedded cluster kept open for them (Result.close), else None


class _Stopped(Exception):
    """The state machine said ``Fail``: the run ends with a ``RunError`` (and its table)."""


@dataclass(frozen=True)
class _Outcome:
    """A future's status when it left ``pending`` (read then, on the client's event loop: the
    future may be ``lost`` again by the time the driver takes it from its queue)."""

    key: Any
    status: str


_READ_DONE = object()  # queued after a metric read's values
_READ_DUE = object()  # queued when metric reads held back to batch them are due

#: metric reads start at most this often (seconds): what finishes meanwhile goes in one read
#: (one round trip through the scheduler per batch, not per finished task)
READ_INTERVAL = 0.05
#: ... unless this many metrics are waiting already
READ_BATCH = 2000


def _error_of(fut: Future) -> tuple[str, str]:
    """``("Type: message", traceback text)`` of an errored future (on the client already)."""
    try:
        exc = fut.exception(timeout=5)
        return f"{type(exc).__name__}: {exc}", "".join(tb_module.format_exception(type(exc), exc, fut.traceback(timeout=5)))
    except Exception as exc:  # recorded as the task's error: its state changed meanwhile
        return f"{type(exc).__name__}: cannot read the task's error ({exc})", ""


class _Inbox:
    """On the client's loop: what arrives during one turn of the loop goes to the driver's
    queue as one list (one wake-up of the driver's thread for a whole message from the
    scheduler, rather than one per finished task)."""

    def __init__(self, events: queue.Queue):
        self.events = events
        self.items: list = []

    def add(self, item: Any) -> None:
        if not self.items:
            asyncio.get_running_loop().call_soon(self._flush)
        self.items.append(item)

    def _flush(self) -> None:
        items, self.items = self.items, []
        self.events.put(items)


async def _when_done(fut: Future, inbox: _Inbox, waiting: tuple[str, ...]) -> None:
    """On the client's loop: hand ``fut``'s outcome to ``inbox`` once its status is not in
    ``waiting`` (what ``Future.add_done_callback`` does, as ``distributed.client.done_callback``
    waits, without a thread hand-off per future).  A first watch waits while ``pending``; a
    watch again after ``TaskLost`` also while ``lost`` (Dask keeps a lost future ``lost``
    until it is in memory again)."""
    while fut.status in waiting:
        await future_status_change(fut)
    inbox.add(_Outcome(fut.key, fut.status))


class ExplorationDriver:
    """Feeds one run's state machine from the Client and carries out its instructions.

    :meth:`abort` is thread-safe: a watchdog (or any other thread, or a Dask event
    handler) calls ``driver.abort(RunError("..."))`` and the run stops at its next step
    with that message, cancelling what it submitted.  The driver never blocks where it
    cannot see an abort: a call that waits for the scheduler goes through :meth:`ask`.
    ``counts`` is ``(tasks done, reports taken)`` after the last ``handle``, an immutable
    pair other threads (the watchdog) read.
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
        self.budget = budget  # (a property: the machine then says when to re-plan)
        self.depth_first = depth_first  # False: no priorities, Dask's own ordering (for comparison)
        self.placement = dict(placement or {})  # task -> worker: loose restrictions (graph.compiling.packing.place_packs)
        self.poll = poll
        self.futures: dict[str, Future] = {}
        self.events: queue.Queue = queue.Queue()
        self.started: float | None = None  # the first submission
        self.ended: float | None = None  # the run's loop ended
        self.first_result: float | None = None  # seconds from the first submission to the first result
        self.first_rung: float | None = None  # seconds from the first submission to the first rung answer
        self.channel: Any = None  # graph.tasks.iterative.ReportChannel, when the run has iterative steps
        self.metrics: Any = None  # graph.tasks.fusedmetric.MetricListener, when the run has fused metric reads
        self.finished = False  # the machine said Finished
        self.counts: tuple[int, int] = (0, 0)  # (tasks done, reports taken): read by the watchdog
        self._abort_reason: str | None = None
        self._owner = threading.get_ident()  # the driver's thread: the only one that feeds the machine
        self._to_read: list[tuple[str, Future]] = []  # metric tasks to read once the read in flight is back
        self._reading = False
        self._read_due = False  # a _READ_DUE is on its way
        self._last_read = float("-inf")  # time.monotonic() of the last read's start
        self.reads: list[tuple[float, int]] = []  # (time.monotonic(), metrics) of each metric read started
        self._inbox = _Inbox(self.events)  # lives on the client's loop
        #: called with the state machine on the driver's thread after each batch of events and each
        #: idle poll (cheap calls only: e.g. pipelines/tracking.py notes the branches that finished)
        self.listeners: list[Callable[[ExplorationState], None]] = []

    def open_reports(self) -> None:
        """Listen to the run's iterative steps (``graph.tasks.iterative.ReportChannel``): each
        report becomes a :class:`Report` event; the machine's :class:`Answer` goes back
        through the channel.  Close with :meth:`close_reports`."""
        if self.state.iterative and self.channel is None:
            from ..tasks.iterative import ReportChannel

            self.channel = ReportChannel(self.client, self._on_report)

    def close_reports(self, timeout: float = CLEANUP_SECONDS) -> None:
        if self.channel is not None:
            self.channel.close(timeout)
        if self.metrics is not None:
            self.metrics.close()

    def open_metrics(self) -> None:
        """Listen to the metrics steps send themselves (reads fused into their tasks,
        ``graph.tasks.fusedmetric``): each becomes a :class:`MetricSent` event, in the same queue hand-off
        as the tasks' outcomes (a step's message arrives ahead of its own completion).  Closed
        with :meth:`close_reports`."""
        fused = self.state.c.fused
        if fused and self.metrics is None:
            from ..tasks.fusedmetric import MetricListener

            inbox = self._inbox

            def on_message(msg: dict) -> None:  # on the client's event loop
                step = msg["step"]
                for mk, metric, scalars, error, trace in msg["reads"]:
                    if mk in fused:
                        inbox.add(MetricSent(mk, step, metric, scalars or {}, error, trace or ""))

            self.metrics = MetricListener(self.client, on_message)

    def _on_report(self, key: str, iteration: int, report: dict) -> None:
        self.events.put(Report(key, iteration, report))  # on the client's event loop: queue it only

    # ---- from other threads ------------------------------------------------------------------
    def abort(self, error: BaseException | str, blame: Any = None) -> None:
        """Stop the run with ``error``'s message (thread-safe; the run raises ``RunError``);
        ``blame``: the task key whose branches failed with it (the others are cancelled)."""
        if self._abort_reason is None:
            self._abort_reason = str(error)
        self.events.put(Abort(str(error), blame))

    def aborting(self) -> bool:
        return self._abort_reason is not None

    def _watch(self, futs: list[Future], waiting: tuple[str, ...] = ("pending",)) -> None:
        """Queue each future's outcome when it leaves ``waiting``: one hand-off to the client's
        loop for the whole batch (``add_done_callback`` costs a thread hand-off per future)."""
        inbox = self._inbox

        def on_loop() -> None:
            for f in futs:
                asyncio.ensure_future(_when_done(f, inbox, waiting))

        self.client.loop.add_callback(on_loop)

    def _read_metrics(self, names: tuple, futs: list[Future]) -> None:
        """Gather finished metric tasks without waiting: their values come back as
        ``MetricRead`` events (a failed read stops the run with its error).  One read is in
        flight at a time, and reads start at most every ``READ_INTERVAL`` seconds; what becomes
        ready meanwhile goes in the next one (one round trip through the scheduler for many
        metrics: a read per finished task cost the scheduler and the workers more than the
        tasks did)."""
        self._to_read.extend(zip(names, futs))
        if self._reading or self._read_due or not self._to_read:
            return
        early = self._last_read + READ_INTERVAL - time.monotonic()
        if early > 0 and len(self._to_read) < READ_BATCH:  # wait for more: one read for them all
            self._read_due = True
            loop = self.client.loop
            loop.add_callback(loop.call_later, early, self.events.put, _READ_DUE)
            return
        self._last_read = time.monotonic()
        batch, self._to_read = self._to_read, []
        self.reads.append((self._last_read, len(batch)))
        self._reading = True
        events = self.events
        coro = self.client.gather([f for _, f in batch], asynchronous=True)
        read = asyncio.run_coroutine_threadsafe(coro, self.client.loop.asyncio_loop)

        def done(read: Any) -> None:
            try:
                values = read.result()
            except BaseException as exc:  # recorded: re-raised in the run as its abort, with the error
                events.put(Abort(f"reading the metrics of {len(batch)} branch(es) failed: {type(exc).__name__}: {exc}"))
                return
            events.put([MetricRead(n, m, s) for (n, _), (m, s) in zip(batch, values)] + [_READ_DONE])

        read.add_done_callback(done)

    # ---- waiting for the scheduler ---------------------------------------------------------------
    def ask(self, fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a call that waits for the scheduler) on a helper thread,
        waited for until it returns or the run is aborted: then the machine takes the
        ``Abort`` (cancelling what the run submitted) and the run ends with its reason.  The
        watchdog (``stall_timeout``) is what bounds the wait for a silent scheduler."""
        try:
            call = functools.partial(fn, *args, **kwargs)
            return wait(in_thread(call, f"quiver-{what}"), what=what, interrupted=self.aborting)
        except Interrupted:
            reason = self._abort_reason or what
            if threading.get_ident() == self._owner:  # (a helper's own ask leaves the machine to the driver's thread)
                self.apply(self._handle(Abort(reason), stimulus_id=f"abort-{uuid.uuid4().hex[:8]}"))  # raises _Stopped (Fail)
            raise _Stopped(reason) from None

    @property
    def budget(self) -> BudgetedRun | None:
        """The run's memory budget (``None``: no planning); setting it tells the state machine to
        say when to re-plan (``Replan`` instructions, ``ExplorationState.planning``)."""
        return self._budget

    @budget.setter
    def budget(self, budget: BudgetedRun | None) -> None:
        self._budget = budget
        self.state.planning = budget is not None and getattr(budget, "budget", None) is not None

    def _handle(self, *events: Any, stimulus_id: str | None = None) -> list:
        out = self.state.handle(*events, stimulus_id=stimulus_id)
        self.counts = self.state.counts()
        return out

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, *, sample_first: bool = False) -> None:
        """Run to the end (``sample_first``: the first branch alone, then the rest after
        :meth:`resume`). Raises ``_Stopped`` when the state machine says ``Fail``."""
        self.apply(self._handle(Start(first_only=sample_first), stimulus_id="run-start"))
        until = (lambda: self.state.sampled) if sample_first else (lambda: self.finished)
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
            items = [i for b in batch for i in (b if isinstance(b, list) else (b,))]  # _Inbox: lists of outcomes
            events = [e for e in map(self._event, items) if e is not None]
            if events:
                self.apply(self._handle(*events))
            self._show()
        self.ended = time.perf_counter()
        self._show(force=True)

    def resume(self, droppable: frozenset | None = None) -> None:
        """After a sampling pass: install the plan's droppable keys and run the rest."""
        events: list = [self._plan_event(droppable)] if droppable is not None else []
        self.apply(self._handle(*events, Start()))
        self.run()

    def _event(self, item: Any) -> Any:
        """A done-callback's outcome as a state machine event (other items are events already)."""
        if item is _READ_DONE or item is _READ_DUE:  # a read is back, or held-back reads are due
            if item is _READ_DONE:
                self._reading = False
            else:
                self._read_due = False
            self._read_metrics((), [])
            return None
        if not isinstance(item, _Outcome):
            return item  # Abort, Report, MetricRead, MetricSent
        if item.key not in self.futures:
            return None  # released or cancelled by the run meanwhile
        if item.status == "finished":
            return TaskFinished(item.key)
        if item.status == "error":
            return TaskFailed(item.key, *_error_of(self.futures[item.key]))
        if item.status == "cancelled":
            return TaskCancelled(item.key)
        return TaskLost(item.key)  # "lost" or "pending": its worker died, Dask computes it again

    def apply(self, instructions: list) -> None:
        """Carry out the state machine's instructions (and feed back what they produce)."""
        todo = list(instructions)
        while todo:
            ins = todo.pop(0)
            if isinstance(ins, Submit):
                self._submit(ins)
            elif isinstance(ins, Gather):  # one round trip per batch, not waited for: MetricRead events
                self._read_metrics(ins.names, [self.futures[n] for n in ins.names])
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
                pass  # the dashboard and the plan read decisions from the state (state.decisions())
            elif isinstance(ins, FirstResult):
                self.first_result = time.perf_counter() - (self.started or time.perf_counter())
            elif isinstance(ins, Replan):  # the machine decides when (graph.state.machine: paced once per handling)
                if self.budget is not None:
                    how = self.budget.on_first_result if ins.why == "first-result" else self.budget.on_decision
                    replan = self.ask(how, self.state.decisions(), what="re-planning memory")
                    todo.extend(self._planned(replan))
            elif isinstance(ins, Watch):  # Dask computes them again: their next outcome is the one
                self._watch([self.futures[n] for n in ins.names if n in self.futures], ("pending", "lost"))
            elif isinstance(ins, Finished):
                self.finished = True
            elif isinstance(ins, Warn):
                self.progress.note(ins.message)
                if not self.progress.enabled:
                    logger.warning("quiver: %s", ins.message)
            elif isinstance(ins, Fail):
                raise _Stopped(ins.message)
            else:  # a new instruction the driver does not carry out is a bug, never skipped silently
                raise TypeError(f"the driver has no handler for the state machine's instruction {ins!r} "
                                "(graph/run/executor.py ExplorationDriver.apply)")

    def _planned(self, droppable: frozenset | None) -> list:
        return [] if droppable is None else self._handle(self._plan_event(droppable), stimulus_id="memory-replan")

    def _plan_event(self, droppable: frozenset) -> MemoryPlanned:
        """The plan's decisions for the state machine: what it may drop, and whether its data fit."""
        return MemoryPlanned(droppable, self.budget.copyable if self.budget is not None else frozenset())

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
        futs = self.client.get(hlg, [k for k in ins.tasks if k not in ins.internal], sync=False)
        for fut in futs:
            self.futures[fut.key] = fut
        self._watch(futs)

    def _show(self, force: bool = False) -> None:
        p = self.state.progress()
        if self.publisher is not None and (force or self.publisher.due()):
            self.publisher.update(self.state.changes(), p["tasks_done"], force)
        self.progress.update(**p, force=force)
        for listener in self.listeners:
            listener(self.state)


def _busy_fraction(driver: ExplorationDriver, snap: dict, threads: int) -> float | None:
    """The worker threads' busy fraction over the run: the compute seconds the scheduler
    recorded (``startstops`` of every task of the run that finished or failed, as
    :class:`graph.run.monitor.RunMonitor` keeps them, less the waits at rungs an iterative step
    reports: a step waiting there holds its thread but computes nothing) over (worker threads x seconds from the first submission to the end
    of the run).  Work lost with a killed worker is not counted.  ``None`` when unknown."""
    if driver.started is None or driver.ended is None:
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


@takes_run_options
def execute(compiled: CompiledPipeline, client: Client, checked: RunOptions | None = None, **options: Any) -> RunRecord:
    """Run ``compiled`` on ``client`` and return a :class:`RunRecord`.

    ``checked``: the run's options, checked already (``graph.run.session.run_checked`` passes
    them down); else ``options`` by keyword, checked here (``graph.run.options.RunOptions``,
    their one owner: ``PipelineError`` when bad, before the cluster is asked anything). The
    cluster's own options (``workers``, ``threads_per_worker``, ``memory_limit``, ``quiet``,
    ``pack``) are the session's: ``execute`` runs on the client it is given. What the others do:

    ``store``: a directory (or ``graph.tasks.store.ResultStore``) of results kept across runs.
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
    before the run stops with a ``RunError`` (``graph.state.watchdog.stall_seconds``: ``None`` is
    the default, 60 s; 0 turns the watchdog off).
    ``compute_value``: a kept value holding Dask collections is computed and gathered
    (default: its partitioned collections are persisted on the cluster; graph/compiling/collections.py).

    Every wait for the scheduler is bounded (docs/architecture.md §4, "Bounded waits"): the
    run's calls end when the watchdog aborts, its clean-up within ``CLEANUP_SECONDS``.
    """
    if checked is not None and options:
        raise TypeError("execute(): give the options checked (checked=) or by keyword, not both")
    opts = checked if checked is not None else check_options(caller="execute()", **options)
    run = _Run.prepare(compiled, client, opts)
    try:
        run.start_services()
        run.drive()
        values = run.gather_values()
        run.read_figures()
    except _Stopped as stop:  # the state machine ended the run (abort, the same metric mistake twice)
        raise run.stopped(str(stop)) from None
    except BaseException as exc:  # the run stopped early: say so on the dashboard (and re-raise)
        run.publisher.finish([], error=f"{type(exc).__name__}: {exc}", timeout=_left(run.deadline))
        raise
    finally:
        run.clean_up()
    return run.record(values)


@dataclass
class _Run:
    """One run's parts, from the options to its record: each method does one stage of
    :func:`execute`, and :meth:`clean_up` ends whatever the stages started, on every path."""

    compiled: CompiledPipeline
    client: Client
    opts: RunOptions
    prepared: Any
    state: ExplorationState
    monitor: RunMonitor
    bar: Progress
    publisher: ExplorationPublisher
    driver: ExplorationDriver
    run_id: str
    start: float  # time.perf_counter() when the run began
    watch: Any = None  # TrainingWatch
    budgeted: Any = None  # BudgetedRun
    watcher: Any = None  # what on_driver returned
    sampler: Any = None  # graph.run.watchdog.Sampler
    registered: bool = False  # the monitor is on the scheduler
    deadline: list = field(default_factory=list)  # when the run's clean-up must be over (set when it starts)
    snap: dict = field(default_factory=dict)  # the monitor's figures (snapshot_on_scheduler)
    rows: list = field(default_factory=list)
    budget_stats: dict = field(default_factory=dict)
    retries: dict = field(default_factory=dict)  # infrastructure retries per task key (graph.parcels)
    threads: int = 0

    @classmethod
    def prepare(cls, compiled: CompiledPipeline, client: Client, opts: RunOptions) -> _Run:
        """The run's parts, nothing asked of the cluster yet: the store and not-rerunnable steps
        applied (graph/compiling/transform.py), the state machine, the monitor, the dashboard's publisher
        and the driver."""
        start = time.perf_counter()
        run_id = uuid.uuid4().hex[:12]
        set_client_process()  # workers in this process (processes=False, the bridge) share its values
        prepared = prepare(reads_for_run(compiled, store=opts.store), opts.store, run_id)
        compiled = prepared.compiled
        state = ExplorationState(compiled, on_metric_error=opts.on_metric_error)
        monitor = RunMonitor(run_id, list(compiled.graph) + list(compiled.metric_graph))
        bar = Progress(enabled=opts.progress)
        publisher = ExplorationPublisher(client, run_id, compiled, naive_tasks=prepared.naive_tasks,
                                         unique_tasks=prepared.unique_tasks)
        driver = ExplorationDriver(state, client, bar, publisher=publisher, depth_first=opts.order == "depth-first",
                                   placement=compiled.placement)
        return cls(compiled, client, opts, prepared, state, monitor, bar, publisher, driver, run_id, start)

    def start_services(self) -> None:
        """Everything that watches or serves the run, before anything is submitted: the
        watchdog, the monitor, the dashboard, training events, the memory budget, the
        iterative steps' reports, and the caller's ``on_driver``."""
        from .watchdog import Sampler

        driver, client = self.driver, self.client
        if self.opts.stall_seconds is not None:  # graph/run/watchdog.py: stop a stuck run with its cause, as an Abort event
            self.sampler = Sampler(
                client, lambda reason: driver.abort(RunError(reason)), self.opts.stall_seconds,
                progress=lambda: driver.counts[0],  # immutable numbers the driver publishes
                reports=lambda: driver.counts[1],  # a reporting step is progress (Watchdog's docs)
            ).start()
        driver.ask(client.register_plugin, self.monitor, what="registering the run's monitor")
        self.registered = True
        driver.ask(ensure_dashboard, client, what="adding the dashboard")  # its pages; the publisher feeds them
        self.publisher.start()
        self.watch = TrainingWatch(client, self.bar)
        self.budgeted = driver.ask(BudgetedRun, client, self.opts.memory_budget, sample=self.opts.sample_sizes,
                                   run_id=self.run_id, disk_bandwidth=self.opts.disk_bandwidth,
                                   what="reading the workers' spill counters")
        driver.budget = self.budgeted
        if self.budgeted is not None:
            self.budgeted.on_plan = self.publisher.memory_plan  # the dashboard's predicted peak, live
        driver.open_reports()  # before anything is submitted: no report is missed
        driver.open_metrics()  # so too the metrics steps send
        if self.opts.on_driver is not None:
            self.watcher = self.opts.on_driver(driver)

    def snapshot(self) -> dict:
        """The run's monitor's figures, read on the scheduler."""
        return self.driver.ask(self.client.run_on_scheduler, snapshot_on_scheduler, name=self.monitor.name,
                               what="reading the run's monitor")

    def drive(self) -> None:
        """Plan the memory budget (after a first branch alone, with ``sample_sizes``) and run
        the driver's loop to the end."""
        driver = self.driver
        sampled = []
        plan = functools.partial(self.budgeted.start, self.compiled, monitor_name=self.monitor.name,
                                 snapshot=self.snapshot, abort=driver.abort)
        if self.opts.sample_sizes:  # the sampling pass runs the driver's loop: on this thread
            droppable = plan(sample_first=lambda: sampled.append(driver.run(sample_first=True)))
        else:  # measuring the workers' memory and planning: waited for as any scheduler call
            droppable = driver.ask(plan, what="planning the memory budget")
        if sampled:
            driver.resume(droppable)
        else:
            driver.apply(driver._handle(driver._plan_event(droppable)))
            driver.run()
        self.rows = self.state.rows()

    def gather_values(self) -> dict:
        """The kept branches' values, by branch key (collections persisted or computed:
        docs/architecture.md §8)."""
        driver, client, rows = self.driver, self.client, self.rows
        names = self.state.result_names()
        ok = [(rows[j].branch.key, name) for j, name in names.items()]
        futs = [driver.futures[name] for _, name in ok]
        gathered = driver.ask(client.gather, futs, what="gathering the results") if ok else []
        values = {key: opened(v) for (key, _), v in zip(ok, gathered)}  # unpickled on this thread
        lazy = [rows[j].branch for j in names if rows[j].branch.lazy is not None]
        if lazy:
            from ..compiling.collections import finish_value

            for b in lazy:
                values[b.key] = driver.ask(finish_value, client, b.lazy, values[b.key], self.opts.compute_value,
                                           what="finishing a collection's value")
        return values

    def read_figures(self) -> None:
        """What the cluster measured: the monitor's snapshot, the budget's spill counters and
        the worker threads (for the busy fraction)."""
        driver = self.driver
        self.snap = self.snapshot()
        events = driver.ask(self.client.get_events, RETRY_TOPIC, what="reading the workers' retries")
        ours = set(self.compiled.graph) | set(self.compiled.metric_graph)
        self.retries = {k: n for k, n in retries_by_key(events).items() if k in ours}
        for k, n in (self.snap.get("rescheduled") or {}).items():  # Dask ran it again after its worker died
            self.retries[k] = self.retries.get(k, 0) + n
        self.budget_stats = driver.ask(self.budgeted.stats, self.snap, self.compiled,
                                       what="reading the workers' spill counters")
        try:
            self.threads = sum(driver.ask(self.client.nthreads, what="counting the worker threads").values())
        except OSError as exc:  # recorded: the cluster is going away, no busy fraction rather than a wrong one
            logger.debug("quiver: worker threads not counted: %s", exc)
            self.threads = 0

    def stopped(self, message: str) -> RunError:
        """The state machine said ``Fail``: the dashboard hears it; the ``RunError`` holds the table."""
        rows = self.state.rows()
        table, _ = build_table(self.compiled, rows, {}, self.snap.get("seconds", {}))
        self.publisher.finish(rows, error=message, timeout=_left(self.deadline), stories=self.state.failure_stories())
        return RunError(message, table=table, story=self.state.story()[-50:])  # the machine's last steps

    def clean_up(self) -> None:
        _clean_up(self.driver, self.watcher, self.watch, self.sampler, self.budgeted, self.bar, self.client,
                  self.monitor.name if self.registered else None, self.prepared, self.deadline)

    def stats(self) -> dict:
        """The run's statistics (``Result.stats``)."""
        compiled, state, rows, snap, driver = self.compiled, self.state, self.rows, self.snap, self.driver
        executed = snap.get("executed", {})
        stats = {
            "naive_tasks": self.prepared.naive_tasks,
            "unique_tasks": self.prepared.unique_tasks,
            "executed_tasks": sum(n for k, n in executed.items() if k in compiled.graph),
            "metric_tasks": sum(n for k, n in executed.items() if k in compiled.metric_graph),
            "branches": len(rows),
            "failed_branches": sum(r.status == "failed" for r in rows),
            "peak_memory_bytes": snap.get("peak_memory_bytes", 0),
            "peak_worker_memory_bytes": snap.get("peak_worker_memory_bytes", 0),
            "wall_seconds": time.perf_counter() - self.start,
            "first_result_seconds": driver.first_result,
            "lost_results": state.lost,
            "second_pass_copies": state.copies_made,  # graph/state/secondpass.py: partitions computed again, not held
            "bridge_tasks": snap.get("bridge_tasks", 0),  # finished in the user's process (graph/cluster/bridge.py)
            "infrastructure_retries": sum(self.retries.values()),  # import deadlocks retried (graph/parcels.py), tasks Dask ran again after their worker died
        }
        stats["busy_fraction"] = _busy_fraction(driver, snap, self.threads)
        if state.iterative:  # iterative steps and pruning (docs/architecture.md §7.2)
            stats.update(_iterative_stats(state, driver))
        stats.update(self.budget_stats)  # spilled/read-back bytes, recomputed tasks, plan vs measured
        plan = getattr(getattr(self, "budgeted", None), "plan", None)
        if "memory_why" in stats and plan is not None:  # with the second passes counted (they are the state's)
            from ..memory.plan import why_text

            stats["memory_why"] = plan.after_run = why_text(plan, stats)  # printed with the plan too
        stats.update(self.prepared.finish(executed))  # graph/compiling/transform.py: loads are not executions
        return stats

    def record(self, values: dict) -> RunRecord:
        """The table, the kept values and the statistics; a ``RunError`` when every branch failed."""
        rows = self.rows
        table, kept = build_table(self.compiled, rows, values, self.snap.get("seconds", {}), self.retries)
        _warn_failed_alternatives(rows)
        if self.state.halving:
            table.attrs["rungs"] = self.state.rung_log()  # Result.rungs: every arrival at a rung, in order
        stats = self.stats()
        self.publisher.finish(rows, stats, stories=self.state.failure_stories())  # final statuses, failures' stories
        failed = every_branch_failed(rows)  # the rule's one owner: graph.state.failures
        if self.opts.raise_if_all_failed and failed:
            raise RunError(failed, table=table, story=self.state.story()[-50:])
        return RunRecord(table=table, values=kept, single=self.compiled.single_value, stats=stats,
                         compiled=self.compiled, memory_plan=self.budgeted.plan, run_id=self.run_id)


def _warn_failed_alternatives(rows: list) -> None:
    """One ``BranchFailureWarning`` line per alternative every branch through which failed
    (``graph.state.failures``): the choice was made without it. Not when every branch failed:
    the run's ``RunError`` says so."""
    if all(r.status == "failed" for r in rows):
        return
    found = failed_everywhere(
        ({name: label for name, label, _ in r.branch.choice_items}, r.status, r.error) for r in rows
    )
    for explore, label, n, first in found:
        first_line = first.splitlines()[0] if first else first
        warnings.warn_explicit(  # one line: no source line of Quiver's to show
            f"every branch through {explore}={label} failed ({n} of {n}), so the choice was made without it; "
            f"the first error: {first_line} ({failure_kind(first)} error). See result.table's error columns.",
            BranchFailureWarning, filename="quiver", lineno=0,
        )


def _left(deadline: list[float]) -> float:
    """Seconds left of the run's clean-up time (``CLEANUP_SECONDS`` from the first call)."""
    if not deadline:
        deadline.append(time.monotonic() + CLEANUP_SECONDS)
    return max(0.0, deadline[0] - time.monotonic())


def _clean_up(driver: ExplorationDriver, watcher: Any, watch: Any, sampler: Any, budgeted: Any, bar: Progress,
              client: Client, monitor: str | None, prepared: Any, ends: list[float]) -> None:
    """End a run on every path, waiting for the scheduler ``CLEANUP_SECONDS`` at most in all
    (the failed run's last dashboard message included): a silent scheduler keeps what is left
    (it is gone, or a later run's names differ)."""
    _left(ends)
    deadline = ends[0]
    driver.close_reports(max(0.0, deadline - time.monotonic()))  # first: a channel left open refuses the client's next run
    stop = getattr(watcher, "close", None) or getattr(watcher, "cancel", None)
    if stop is not None:
        stop()
    if sampler is not None:  # graph/run/watchdog.py
        sampler.stop()
    bar.close()
    driver.futures.clear()
    steps: list = [(prepared.forget, (client,), "clearing the run-once markers")]  # graph/tasks/rerun.py: every path
    if watch is not None:
        steps.append((watch.close, (), "unsubscribing from training events"))
    if budgeted is not None:
        steps.append((budgeted.close, (), "removing the memory plan"))
    if monitor is not None:
        steps.append((client.unregister_scheduler_plugin, (monitor,), "removing the run's monitor"))
    for fn, args, what in steps:
        try:
            within(deadline, fn, *args, what=what)
        except NoAnswer as exc:
            logger.info("quiver: %s", exc)
        except Exception as exc:  # recorded: the scheduler may be gone; nothing left to clean there
            logger.debug("quiver: %s failed: %s", what, exc)
