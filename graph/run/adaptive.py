"""The driver of an adaptive search (issue 47): a sampler's proposals join one running Dask graph.

The rule (:class:`graph.state.proposals.ProposalRule`) decides; this module only talks: an
:class:`~graph.state.proposals.Ask` becomes ``study.ask()``, the trial's answers a branch
(:class:`graph.compiling.trials.SearchSpace`), compiled against what the run already holds
(:func:`graph.compiling.trials.compile_proposal`: same step, parameters and input, same key);
a :class:`~graph.state.proposals.Run` submits only the keys the rule found new, to the same
client, while the other trials' tasks run (a task reading a result still being computed by
another trial waits for it, as any Dask task does); futures' outcomes come back as events; a
:class:`~graph.state.proposals.Tell` becomes ``study.tell``. Nothing waits for a round of
proposals: a trial told frees its slot for the next ask at once. An iterative (generator) last
step's reports come in on the run's report channel (``graph.tasks.iterative.ReportChannel``, as
in any run) and become :class:`~graph.state.proposals.Reported` events; a
:class:`~graph.state.proposals.Judge` becomes ``trial.report`` and ``trial.should_prune`` (the
study's pruner); a pruned trial's step is stopped by cancelling it, the stop every run uses (the
step closes its generator at its next report, ``graph.tasks.iterative``).

>>> from pipelines import Pipeline, space                                        # doctest: +SKIP
>>> from optuna.distributions import FloatDistribution                           # doctest: +SKIP
>>> def load(): return 1.0                                                       # doctest: +SKIP
>>> def fit(x, a): return {"score": -(x - a) ** 2}                               # doctest: +SKIP
>>> node = Pipeline("s").source(load).explore("m", space(fit, a=FloatDistribution(0, 2))).search("score", n_trials=8)  # doctest: +SKIP
>>> record = run_search(node.spec, opts=check_options(workers=1, quiet=True))   # doctest: +SKIP
>>> record.stats["trials"], record.stats["executed_tasks"]                       # doctest: +SKIP
(8, 9)
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
import traceback as tb_module
import uuid
from dataclasses import dataclass, field
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed.diagnostics.plugin import SchedulerPlugin

from ..bounded import CLEANUP_SECONDS, answered, within
from ..compiling.trials import SearchSpace, common_keys, compile_proposal
from ..errors import PipelineError, RunError
from ..keys import identities_remembered
from ..parcels import opened, set_client_process
from ..spec import SearchSpec
from ..state.events import (
    Abort,
    Cancel,
    Finished,
    Gather,
    MetricRead,
    MetricSent,
    Release,
    Report,
    TaskFailed,
    TaskFinished,
)
from ..state.metric import extract_metric
from ..state.proposals import (
    COMPLETE,
    FAIL,
    PRUNED,
    Ask,
    Judge,
    ProposalRule,
    Proposed,
    Reported,
    Run,
    SearchStart,
    Tell,
    Verdict,
)
from .options import RunOptions, check_options

__all__ = ["SearchRecord", "run_search", "ExecutedCounter"]

#: seconds a finished metric read may take to come back (it is a float, on the cluster already)
READ_SECONDS = 60


class ExecutedCounter(SchedulerPlugin):
    """Counts, on the scheduler, each key's runs (``processing`` -> ``memory`` or ``erred``): what
    a search really executed (a task Dask ran again after a worker loss counts twice)."""

    def __init__(self, name: str):
        self.name = name
        self.executed: dict[str, int] = {}

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish in ("memory", "erred"):
            self.executed[key] = self.executed.get(key, 0) + 1


def _executed_on_scheduler(dask_scheduler: Any = None, name: str = "") -> dict:
    plugin = dask_scheduler.plugins.get(name)
    return dict(plugin.executed) if plugin is not None else {}


@dataclass
class SearchRecord:
    """What a search leaves: ``rows`` (one dict per trial, in proposal order), the ``study``,
    the ``best`` trial's number (``None``: no trial completed) and its output ``value``, ``stats``."""

    rows: list
    study: Any
    best: int | None
    value: Any
    stats: dict = field(default_factory=dict)


def _study(search: SearchSpec) -> Any:
    try:
        import optuna
    except ImportError:  # checked at build time too; a pickled node may travel
        raise PipelineError("a search needs Optuna: pip install 'quiver[optuna]'") from None
    if search.study is not None:
        return search.study
    pruner = getattr(search, "pruner", None)  # None: no pruner (Optuna's default would be a MedianPruner)
    return optuna.create_study(direction="maximize" if search.mode == "max" else "minimize", sampler=search.sampler,
                               pruner=optuna.pruners.NopPruner() if pruner is None else pruner)


class _Search:
    def __init__(self, search: SearchSpec, space: SearchSpace, client: Any, in_flight: int, progress: bool):
        self.search, self.client, self.progress = search, client, progress
        self.space = space
        self.study = _study(search)
        self.rule = ProposalRule(search.n_trials, in_flight, search.mode)
        self.events: queue.Queue = queue.Queue()
        self.futures: dict[str, Any] = {}
        self.trials: dict[int, Any] = {}  # trial number -> optuna trial (asked, not told)
        self.choices: dict[int, dict] = {}
        self.scalars: dict[str, dict] = {}  # metric key -> the last step's scalar entries
        self.proposed_at: dict[int, float] = {}
        self.told_at: dict[int, float] = {}
        self.tracebacks: dict[str, str] = {}
        self.last: dict = {}  # the last proposal's tasks (a Run names some of them)
        self.reads: dict = {}  # metric key -> its read task (submitted if a fused step's message never comes)
        self.listener: Any = None
        self.channel: Any = None  # graph.tasks.iterative.ReportChannel: iterative steps' reports
        self.outcomes = 0  # outcomes and metrics taken: the watchdog's progress (an int, read by its thread)
        self.stopped: str | None = None  # why the watchdog stopped the search
        self.step_keys: set[str] = set()
        self.metric_keys: set[str] = set()
        self.started = time.perf_counter()

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        todo = list(self.rule.handle(SearchStart()))
        while True:
            while todo:
                ins = todo.pop(0)
                answer = self.apply(ins)
                if isinstance(ins, Finished):
                    return
                if answer:  # depth first: a proposal's Run comes before the next Ask compiles another
                    todo[:0] = self.rule.handle(*answer)
            batch = [self.events.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self.events.get_nowait())
            todo.extend(self.rule.handle(*[self.outcome(f) for f in batch]))

    def listen(self) -> None:
        """Take the metrics the last steps send themselves (``graph.tasks.fusedmetric``) as
        :class:`MetricSent` events, in the queue the futures' outcomes go to."""
        from ..tasks.fusedmetric import MetricListener

        events = self.events

        def on_message(msg: dict) -> None:  # on the client's event loop: queue only
            step = msg["step"]
            for mk, metric, scalars, error, trace in msg["reads"]:
                events.put(MetricSent(mk, step, metric, scalars or {}, error, trace or ""))

        self.listener = MetricListener(self.client, on_message)
        if self.space.iterative:
            from ..tasks.iterative import ReportChannel

            def on_report(key: str, iteration: int, report: dict) -> None:  # on the client's event loop
                events.put(Report(key, iteration, report))

            self.channel = ReportChannel(self.client, on_report)

    def stop(self, reason: str) -> None:
        """From another thread (the watchdog): end the search with ``reason`` at its next step."""
        self.stopped = reason
        self.events.put(Abort(reason))

    def outcome(self, fut: Any) -> Any:
        self.outcomes += 1
        if isinstance(fut, Abort):
            return fut
        if isinstance(fut, Report):
            # Optuna's step counts from 0 (``for step in range(n): trial.report(v, step)``), a report's iteration from 1
            return Reported(fut.name, fut.iteration - 1, self.report_metric(fut.values))
        if isinstance(fut, MetricSent):
            if fut.error is None:
                self.scalars.setdefault(fut.name, dict(fut.scalars))
            elif fut.traceback:
                self.tracebacks.setdefault(fut.name, fut.traceback)
            return fut
        if fut.status == "finished":
            return TaskFinished(fut.key)
        if fut.status == "cancelled":  # stopped by the search (a pruned trial's step)
            return TaskFailed(fut.key, "CancelledError: stopped by the search")
        try:
            exc = fut.exception(timeout=5)
            error = f"{type(exc).__name__}: {exc}"
            self.tracebacks[fut.key] = "".join(tb_module.format_exception(type(exc), exc, fut.traceback(timeout=5)))
        except Exception as exc:  # its state changed meanwhile: recorded as its error
            error = f"{type(exc).__name__}: cannot read the task's error ({exc})"
        return TaskFailed(fut.key, error)

    def report_metric(self, values: dict) -> float:
        """The search metric of one report (NaN when it lacks it)."""
        try:
            return float(extract_metric(values, self.search.metric, f"search({self.search.metric_name!r})")[0])
        except (KeyError, TypeError, ValueError):  # a report without the metric (or not a number): NaN, as the pruner sees a diverged value
            return float("nan")

    def judge(self, ins: Judge) -> Verdict:
        """Report to the trial and ask the study's pruner; a pruner that raises prunes nothing."""
        trial = self.trials.get(ins.trial)
        if trial is None:
            return Verdict(ins.trial, ins.step, False)
        try:
            trial.report(ins.value, ins.step)
            return Verdict(ins.trial, ins.step, bool(trial.should_prune()))
        except Exception as exc:  # recorded on the trial: the trial goes on unjudged
            with contextlib.suppress(Exception):
                trial.set_user_attr("quiver_pruner_error", f"{type(exc).__name__}: {exc}"[:2000])
            return Verdict(ins.trial, ins.step, False)

    def apply(self, ins: Any) -> list:
        if isinstance(ins, Ask) and self.stopped is None:
            return [self.ask()]
        if isinstance(ins, Judge):
            return [self.judge(ins)]
        if isinstance(ins, Cancel):
            futs = [self.futures.pop(n) for n in ins.names if n in self.futures]
            if futs:
                self.client.cancel(futs)
            return []
        if isinstance(ins, Run):
            self.submit(ins)
        elif isinstance(ins, Gather):
            return [self.read(name) for name in ins.names]
        elif isinstance(ins, Tell):
            self.tell(ins)
        elif isinstance(ins, Ask):  # stopped meanwhile: the ask is answered by a failed proposal
            trial = self.study.ask()
            self.trials[trial.number] = trial
            self.choices[trial.number] = {}
            return [Proposed(trial.number, (), "", error=f"the search stopped: {self.stopped}")]
        elif isinstance(ins, Release):
            for name in ins.names:
                fut = self.futures.pop(name, None)
                if fut is not None:
                    fut.release()
        elif not isinstance(ins, Finished):
            raise TypeError(f"the search's driver has no handler for {ins!r}")
        return []

    # ---- instructions --------------------------------------------------------------------------
    def ask(self) -> Proposed:
        trial = self.study.ask()
        number = trial.number
        self.trials[number] = trial
        self.proposed_at[number] = time.perf_counter() - self.started
        try:
            proposal = compile_proposal(self.space.suggest(trial))
        except Exception as exc:  # the trial fails with it; the search goes on
            self.choices[number] = {}
            return Proposed(number, (), "", error=f"{type(exc).__name__}: {exc}")
        self.choices[number] = proposal.choices
        self.last = proposal.tasks
        self.reads.setdefault(proposal.metric, proposal.read)
        self.step_keys.update(proposal.path)
        self.metric_keys.add(proposal.metric)
        return Proposed(number, proposal.path, proposal.metric, fused=proposal.fused)

    def submit(self, ins: Run) -> None:
        tasks = {k: self.last[k] if k in self.last else self.reads[k] for k in ins.names}
        name = f"quiver-search-{uuid.uuid4().hex[:8]}"
        layer = MaterializedLayer(tasks, annotations={"priority": ins.priority})
        hlg = HighLevelGraph({name: layer}, {name: set()})
        futs = self.client.get(hlg, list(ins.names), sync=False)
        events = self.events
        for fut in futs:
            self.futures[fut.key] = fut
            fut.add_done_callback(events.put)

    def read(self, name: str) -> MetricRead:
        metric, scalars = self.futures[name].result(timeout=READ_SECONDS)
        self.scalars[name] = dict(scalars)
        return MetricRead(name, metric, scalars)

    def tell(self, ins: Tell) -> None:
        from optuna.trial import TrialState

        trial = self.trials.pop(ins.trial)
        self.told_at[ins.trial] = time.perf_counter() - self.started
        if self.search.user_attrs:  # the last step's scalars, on the trial itself (SearchSpec.user_attrs)
            rec = self.rule.trials.get(ins.trial)
            for key, value in self.scalars.get(rec.metric if rec is not None else "", {}).items():
                trial.set_user_attr(key, value)
        if ins.error is not None:
            with contextlib.suppress(Exception):  # shown by optuna-dashboard; not worth a failed search
                trial.set_user_attr("quiver_error", ins.error[:2000])
        if ins.state == COMPLETE:
            self.study.tell(trial, ins.value)
        else:
            self.study.tell(trial, state=TrialState.PRUNED if ins.state == PRUNED else TrialState.FAIL)
        if self.progress:
            r = self.rule
            best = r.trials[r.best].value if r.best is not None else None
            print(f"\rsearch: {r.told}/{r.n_trials} trials told, best {best}", end="", file=sys.stderr, flush=True)

    def abort(self, reason: str) -> None:
        """Tell the open trials FAIL (a study in a storage keeps no trial RUNNING forever)."""
        for ins in self.rule.handle(Abort(reason)):
            if isinstance(ins, Tell):
                with contextlib.suppress(Exception):
                    self.tell(ins)
        for trial in list(self.trials.values()):  # asked, not yet proposed to the rule
            with contextlib.suppress(Exception):
                from optuna.trial import TrialState

                self.study.tell(trial, state=TrialState.FAIL)

    # ---- after -------------------------------------------------------------------------------
    def best_value(self) -> Any:
        best = self.rule.best
        if best is None:
            return None
        rec = self.rule.trials[best]
        fut = self.futures.get(rec.tasks[-1]) if rec.tasks else None
        if fut is None:
            return None
        return opened(fut.result(timeout=READ_SECONDS))

    def rows(self) -> list[dict]:
        out = []
        for number, rec in sorted(self.rule.trials.items(), key=lambda kv: kv[1].order):
            row: dict[str, Any] = {"trial": number}
            for explore, (label, params) in self.choices.get(number, {}).items():
                row[explore] = label
                for p, v in params.items():
                    row[f"{explore}.{p}"] = v
            row["value"] = rec.value
            row.update({k: v for k, v in self.scalars.get(rec.metric, {}).items() if k not in row})
            row["state"] = rec.state
            row["error"] = rec.error
            row["traceback"] = next((self.tracebacks[k] for k in (*rec.tasks, rec.metric) if k in self.tracebacks), None)
            row["proposed_at"] = self.proposed_at.get(number)
            row["told_at"] = self.told_at.get(number)
            out.append(row)
        return out

    def settle(self, deadline: float) -> None:
        """Wait, until ``deadline`` (``time.monotonic()``), for the submitted tasks not yet done."""
        from distributed import wait

        pending = [f for f in self.futures.values() if not f.done()]
        if pending:
            wait(pending, timeout=max(0.0, deadline - time.monotonic()))

    def release_all(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.channel is not None:
            self.channel.close(CLEANUP_SECONDS)
            self.channel = None
        futs, self.futures = list(self.futures.values()), {}
        with contextlib.suppress(Exception):
            self.client.cancel([f for f in futs if not f.done()])
        for f in futs:
            with contextlib.suppress(Exception):
                f.release()


def _modules(space: SearchSpace) -> list[str]:
    """What the steps import (``graph.cluster.warmup.step_modules``' rule), before any proposal."""
    from types import SimpleNamespace

    from ..cluster.warmup import step_modules
    from ..spec import ExploreSpec

    calls = [space.source.call]
    for s in space.line:
        calls.extend(a.call for a in s.alternatives) if isinstance(s, ExploreSpec) else calls.append(s.call)
    tasks = {i: SimpleNamespace(func=c.fn, args=(), kwargs=c.param_dict) for i, c in enumerate(calls)}
    return step_modules(SimpleNamespace(graph=tasks, metric_graph={}))


def _share_common(client: Any, space: SearchSpace, n_trials: int) -> tuple[str | None, str | None]:
    """Before any proposal: the results every trial reads (the source and the steps before the
    first choice, :func:`graph.compiling.trials.common_keys`) are copied to every other worker
    the moment they exist (``graph.run.sharedcopies``), and the first trials made ready by them
    start on the workers that are free (``graph.run.spread``). Without them, Dask places each
    trial only on a worker holding that input (``decide_worker`` looks at no other), so the
    first trials queued on the one worker that loaded the data while the others waited for work
    stealing: on issue 47's benchmark (c) the second worker's first fit started 1.8-2.2 s into a
    search whose fits take 0.3-1.5 s each (two runs, load 12-19); with them, 0.17 s after the
    source ended. Returns the two plugins' names (``None``: not installed)."""
    from . import sharedcopies, spread

    if n_trials < 2:
        return None, None
    try:
        common = common_keys(space)
    except Exception as exc:  # recorded: the copies are a head start; the first proposal reports a real error
        import logging

        logging.getLogger(__name__).info("quiver: no shared inputs for the search (%s: %s)", type(exc).__name__, exc)
        return None, None
    return sharedcopies.install_shared(client, {k: n_trials for k in common}), spread.install_readers(client, common)


def _unshare(client: Any, copies: str | None, placing: str | None, deadline: float) -> tuple[dict, int]:
    """Remove :func:`_share_common`'s plugins by ``deadline``; returns what they did."""
    from . import sharedcopies, spread

    copied = sharedcopies.remove(client, copies, max(0.0, deadline - time.monotonic()))
    return copied, spread.remove(client, placing, max(0.0, deadline - time.monotonic()))


def run_search(search: SearchSpec, client: Any = None, opts: RunOptions | None = None) -> SearchRecord:
    """Run ``search`` on ``client`` (a ``Client``, an address, or ``None``: an embedded
    ``LocalCluster`` of ``opts.workers``) and return its :class:`SearchRecord`. ``opts``: the run's
    options, checked (``graph.run.options.check_options``; ``None``: every default); a search
    reads those :func:`graph.run.options.search_options` names. ``stall_timeout``: the
    watchdog's one meaning (``graph.state.watchdog.stall_seconds``): a search whose workers are
    gone, paused or cannot run its tasks, or whose scheduler does not answer, for that long is
    stopped with a ``RunError`` naming why (its open trials told ``FAIL``)."""
    from ..cluster.connect import connect
    from ..cluster.warmup import warm_workers

    opts = check_options() if opts is None else opts
    progress = sys.stderr.isatty() if opts.progress is None else opts.progress
    info: dict = {}
    clock = time.perf_counter()
    space = SearchSpace(search)  # before a cluster starts: a malformed line fails here
    modules = _modules(space)
    with connect(client, n_workers=opts.workers, threads_per_worker=opts.threads_per_worker,
                 memory_limit=opts.memory_limit, quiet=opts.quiet, info=info, preload=modules) as c:
        cluster_seconds = time.perf_counter() - clock
        set_client_process()  # workers in this process share its values (graph.parcels)
        threads = answered(c.nthreads, what="counting the workers' threads")
        in_flight = search.in_flight or max(1, sum(threads.values()))
        warm_workers(c, modules)
        counter = ExecutedCounter(f"quiver-search-{uuid.uuid4().hex[:8]}")
        answered(c.register_plugin, counter, what="registering the search's counter")
        run = _Search(search, space, c, in_flight, progress)
        started = time.perf_counter()
        from .watchdog import Sampler

        stall = opts.stall_seconds  # None: the watchdog is off
        watchdog = Sampler(c, run.stop, stall, progress=lambda: run.outcomes).start() if stall else None
        copies = placing = None
        ended = False  # the search ran to its end (no error, no Ctrl-C): only then are its tasks awaited
        try:
            copies, placing = _share_common(c, space, search.n_trials)
            run.listen()
            with identities_remembered():  # each step function's identity worked out once per search
                run.run()
            if watchdog is not None:
                watchdog.stop()
            if run.stopped is not None:
                raise RunError(run.stopped)
            value = run.best_value()
            ended = True
        except BaseException as exc:  # any end (Ctrl-C too): open trials are told FAIL, then it propagates
            run.abort(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if watchdog is not None:
                watchdog.stop()
            wall = time.perf_counter() - started
            deadline = time.monotonic() + CLEANUP_SECONDS
            executed: dict = {}
            if ended:
                with contextlib.suppress(Exception):
                    # a trial is told when its last step sends its metric, which can reach this client
                    # before the scheduler has the step's own end: wait for the steps still running, so
                    # the counter is read after their transitions (else executed < unique, now and then);
                    # not after an error or Ctrl-C, which must not wait on tasks that may never end
                    run.settle(deadline)
            with contextlib.suppress(Exception):
                executed = within(deadline, c.run_on_scheduler, _executed_on_scheduler, name=counter.name,
                                  what="reading the search's counter")
            run.release_all()
            with contextlib.suppress(Exception):
                within(deadline, c.unregister_scheduler_plugin, counter.name, what="removing the search's counter")
            copied, spread_tasks = _unshare(c, copies, placing, deadline)
            if progress:
                print(file=sys.stderr)
    rows = run.rows()
    rule = run.rule
    paths = [r.tasks for r in rule.trials.values() if r.tasks]
    naive = sum(len(p) for p in paths)  # step tasks if every trial ran its own whole path
    by_depth: dict[int, set] = {}
    for p in paths:
        for i, k in enumerate(p[:-1]):
            by_depth.setdefault(i, set()).add(k)
    prefix_naive = sum(len(p) - 1 for p in paths)
    states = [r["state"] for r in rows]
    stats = {
        "trials": len(rows),
        "complete": states.count(COMPLETE),
        "pruned": states.count(PRUNED),
        "failed": states.count(FAIL),
        "in_flight": in_flight,
        "naive_tasks": naive,
        "unique_tasks": len(run.step_keys),
        "executed_tasks": sum(n for k, n in executed.items() if k in run.step_keys),
        "metric_tasks": sum(n for k, n in executed.items() if k in run.metric_keys),
        # prefix steps (every step but a trial's last, the source included) its trials needed, less those that ran
        "prefix_tasks_saved": prefix_naive - sum(len(s) for s in by_depth.values()),
        "reused_keys": rule.reused,
        "stopped_steps": rule.stopped,  # last steps the study's pruner stopped mid-training
        # the inputs every trial reads, copied to the other workers the moment they existed: {key: [worker, ...]}
        "shared_copies": copied,
        "spread_tasks": spread_tasks,  # trials sent to a worker not yet holding their input (graph/run/spread.py)
        "wall_seconds": wall,
        "cluster_seconds": cluster_seconds,
        "cluster": info.get("cluster"),
    }
    record = SearchRecord(rows, run.study, rule.best, value, stats)
    if opts.raise_if_all_failed and rows and not stats["complete"]:
        first = next((r for r in rows if r["error"]), rows[0])
        exc = RunError(f"every trial of the search failed; the first: {first['error']}")
        exc.record = record  # type: ignore[attr-defined]
        raise exc
    return record
