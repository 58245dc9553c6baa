"""Run a compiled exploration on a Dask cluster, deciding chooses as branch results arrive.

Branches are submitted stage by stage: everything not behind a choose at once,
then the branches a choose keeps as soon as it decides (per group, and early for
first-k-above-threshold, whose unfinished branches are cancelled).  Futures are
held for exactly as long as a live branch still needs a key, so intermediates
are released as soon as their last consumer has run.

>>> from graph.compiler import compile_spec       # doctest: +SKIP
>>> record = execute(compile_spec(spec), client)  # doctest: +SKIP
>>> record.table.status.value_counts()            # doctest: +SKIP
"""

from __future__ import annotations

import queue
import sys
import time
import traceback as tb_module
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client, Future

from .memory.budget import BudgetedRun
from .compiler import CompiledPipeline
from .errors import RunError
from .monitor import RunMonitor, snapshot_on_scheduler
from .progress import Progress
from .dashboard import ensure_dashboard
from .dashboard.protocol import ExplorationPublisher, TrainingWatch
from .ranking import decide
from .table import RowState, build_table

__all__ = ["RunRecord", "execute"]

WAITING, SUBMITTED, DONE, FAILED = "waiting", "submitted", "done", "failed"


@dataclass
class _Tip:
    """A point whose result the run needs: a choose input (its metric) or an output branch (its value)."""

    id: int
    kind: str  # "choose" or "output"
    branch: Any
    choose: int | None = None
    index: int = 0
    state: str = WAITING
    dead: bool = False
    metric: float | None = None
    scalars: dict | None = None
    error: str | None = None
    traceback: str | None = None
    failed_step: str | None = None

    @property
    def resolved(self) -> bool:
        return self.state in (DONE, FAILED)


@dataclass
class RunRecord:
    """What a run produced: the table, the kept values (best first), and statistics."""

    table: Any
    values: list
    single: bool
    stats: dict = field(default_factory=dict)
    compiled: CompiledPipeline | None = None
    memory_plan: Any = None


class _Execution:
    def __init__(self, compiled: CompiledPipeline, client: Client, progress: Progress, depth_first: bool = True):
        self.c = compiled
        self.client = client
        self.progress = progress
        self.depth_first = depth_first  # False: no priorities, Dask's own ordering (for comparison)
        self.started: float | None = None  # set at the first submission
        self.first_result: float | None = None
        self.abort: str | None = None
        self.droppable: frozenset[str] = frozenset()  # released early, recomputed on demand (memory plan)
        self.released: set[str] = set()  # finished results the run let go of
        self.current: dict[str, str] = {}  # key -> the name it is computed under now (a recompute copy)
        self.alias: dict[str, str] = {}  # recompute copy -> the key it copies
        self.recomputes = 0
        self.on_first_result: Any = None  # called once, when the first branch result is in
        self.on_decision: Any = None  # called after chooses decided (at most once per event batch)
        self._decisions_seen = 0
        self.futures: dict[str, Future] = {}
        self.submitted: set[str] = set()
        self.finished: set[str] = set()
        self.errored: set[str] = set()
        self.errors: dict[str, tuple[str, str]] = {}
        self.metric_values: dict[str, tuple[float, dict]] = {}
        self.candidates: set[str] = set()
        self.events: queue.Queue[str] = queue.Queue()
        self.gate: dict[tuple[int, int], str] = {}
        self.decided_groups: set[tuple[int, Any]] = set()
        self.completion: dict[int, list[int]] = defaultdict(list)
        self.tips: list[_Tip] = []
        self.choose_tips: dict[tuple[int, int], _Tip] = {}
        self.key_tips: dict[str, list[_Tip]] = defaultdict(list)
        for cp in compiled.chooses:
            for i, b in enumerate(cp.inputs):
                tip = _Tip(len(self.tips), "choose", b, cp.index, i)
                self.tips.append(tip)
                self.choose_tips[(cp.index, i)] = tip
                self.key_tips[cp.metric_keys[i]].append(tip)
        self.output_tips = []
        for j, b in enumerate(compiled.branches):
            tip = _Tip(len(self.tips), "output", b, None, j)
            self.tips.append(tip)
            self.output_tips.append(tip)
        for tip in self.tips:
            for k in tip.branch.lineage:
                self.key_tips[k].append(tip)

    # ---- submission -------------------------------------------------------------------
    def _metric_key(self, tip: _Tip) -> str | None:
        if tip.kind != "choose":
            return None
        return self.c.chooses[tip.choose].metric_keys[tip.index]

    def _open(self, tip: _Tip) -> bool:
        return all(self.gate.get(g) == "keep" for g in tip.branch.gates)

    def _priority(self, tip: _Tip) -> int:
        """Depth-first: branches past more chooses first, then in declaration order."""
        n = len(self.tips)
        return len(tip.branch.gates) * n + (n - tip.id)

    def _tip_keys(self, tip: _Tip, dsk: dict[str, Any], priority: dict[str, int]) -> None:
        """Add what ``tip`` needs that the run does not hold: walking back from its target,
        every task whose result is neither held nor already in ``dsk``.

        A result the run released after it was computed (a memory plan's ``recompute``
        decision) is recomputed under a distinct key (``<key>~againN``, the task copied with
        ``Task.substitute``, its consumers pointed at the copy): resubmitting the released
        key itself could race with Dask still forgetting it, which cancels the new future."""
        p = self._priority(tip)
        target = self._metric_key(tip) or tip.branch.key
        need: list[str] = []
        seen: set[str] = set()
        stack = [target]
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            name = self.current.get(k, k)
            if name in dsk:
                if p > priority[name]:  # a more urgent tip needs it: so do its inputs
                    priority[name] = p
                    stack.extend(self._task(k).dependencies)
                continue
            if name in self.futures:
                continue
            need.append(k)
            stack.extend(self._task(k).dependencies)
        for k in need:
            if k in self.released and k != target:
                self.recomputes += 1
                clone = f"{k}~again{self.recomputes}"
                self.current[k] = clone
                self.alias[clone] = k
                self.finished.discard(k)
        for k in need:
            task = self._task(k)
            subs = {d: self.current[d] for d in task.dependencies if d in self.current}
            name = self.current.get(k, k)
            dsk[name] = task.substitute(subs, key=name) if (subs or name != k) else task
            priority[name] = p

    def _ends_at_choose(self, b: Any) -> bool:
        """True when the branch has no step after its last choose (its value is the choose's input)."""
        if not b.gates:
            return False
        ci, i = b.gates[-1]
        return self.c.chooses[ci].inputs[i].key == b.key

    def _task(self, key: str) -> Any:
        return self.c.graph[key] if key in self.c.graph else self.c.metric_graph[key]

    def _submit(self, dsk: dict[str, Any], priority: dict[str, int]) -> None:
        if not dsk:
            return
        annotations = {"priority": priority.__getitem__} if self.depth_first else None
        layer = MaterializedLayer(dsk, annotations=annotations)
        hlg = HighLevelGraph({f"quiver-{uuid.uuid4().hex[:8]}": layer}, {})
        hlg.dependencies = {name: set() for name in hlg.layers}
        futures = self.client.get(hlg, list(dsk), sync=False)
        for fut in futures:
            self.futures[fut.key] = fut
            self.submitted.add(fut.key)
            fut.add_done_callback(lambda f: self.events.put(f.key))

    def prefetch_first(self) -> list[str]:
        """Submit the first branch alone and wait for it: a sampling pass whose results the
        run then reuses (its sizes and seconds feed the memory plan)."""
        tip = next((t for t in self.tips if not t.branch.gates), None)
        if tip is None:
            return []
        dsk: dict[str, Any] = {}
        priority: dict[str, int] = {}
        self._tip_keys(tip, dsk, priority)
        self.started = time.perf_counter()
        self._submit(dsk, priority)
        pending = set(dsk)
        seen = []
        while pending:  # wait, but stop at once on an abort (e.g. a result too big for the budget)
            try:
                key = self.events.get(timeout=0.25)
            except queue.Empty:
                continue
            if isinstance(key, tuple):
                raise RunError(key[1])
            seen.append(key)
            pending.discard(key)
        for key in seen:  # the run loop handles them as usual
            self.events.put(key)
        return list(dsk)

    def _submit_ready(self) -> None:
        dsk: dict[str, Any] = {}
        priority: dict[str, int] = {}
        ready = []
        for tip in self.tips:
            if tip.state != WAITING or tip.dead or not self._open(tip):
                continue
            self._tip_keys(tip, dsk, priority)
            tip.state = SUBMITTED
            ready.append(tip)
        self._submit(dsk, priority)
        for tip in ready:
            self._check(tip)

    # ---- events -----------------------------------------------------------------------
    def _check(self, tip: _Tip) -> None:
        """Resolve ``tip`` if what it waits for has finished or failed."""
        if tip.resolved or tip.dead or tip.state != SUBMITTED:
            return
        mk = self._metric_key(tip)
        for k in tip.branch.lineage + ((mk,) if mk else ()):
            if k in self.errored:
                self._fail(tip, k)
                return
        target = mk or tip.branch.key
        if target in self.finished:
            if mk is not None:
                tip.metric, tip.scalars = self.metric_values[mk]
                self.completion[tip.choose].append(tip.index)
            tip.state = DONE
            if self.first_result is None:
                self.first_result = time.perf_counter() - self.started
            self._mark(tip)

    def _fail(self, tip: _Tip, key: str) -> None:
        root = next((k for k in tip.branch.lineage if k in self.errored), key)
        tip.state = FAILED
        tip.error, tip.traceback = self.errors[root]
        if root in self.c.graph:
            tip.failed_step = root.rsplit("-", 1)[0]
        else:
            tip.failed_step = f"choose({self.c.chooses[tip.choose].spec.metric_name!r})"
        if tip.kind == "choose":
            self.completion[tip.choose].append(tip.index)
        self._mark(tip)

    def _mark(self, tip: _Tip) -> None:
        """Queue the keys ``tip`` touches for a release check."""
        self.candidates.update(tip.branch.lineage)
        mk = self._metric_key(tip)
        if mk:
            self.candidates.add(mk)

    def _fetch_metrics(self, keys: list) -> None:
        """Read the finished metric tasks among ``keys`` with one ``gather``."""
        futs = [
            self.futures[k]
            for k in keys
            if isinstance(k, str) and k in self.c.metric_graph and k not in self.metric_values
            and k in self.futures and self.futures[k].status == "finished"
        ]
        if futs:
            self.metric_values.update(zip([f.key for f in futs], self.client.gather(futs)))

    def _on_event(self, key: str) -> None:
        if isinstance(key, tuple):  # ("abort", message) from a scheduler-side guard
            self.abort = key[1]
            return
        fut = self.futures.get(key)
        if fut is None:
            return
        orig = self.alias.get(key, key)  # a recompute copy stands for the key it copies
        if self.current.get(orig, orig) != key:
            return  # an older copy's late event
        if fut.status == "finished":
            self.finished.add(orig)
            if orig in self.c.metric_graph and orig not in self.metric_values:
                self.metric_values[orig] = fut.result()
        elif fut.status == "error":
            self.errored.add(orig)
            exc = fut.exception()
            text = "".join(tb_module.format_exception(type(exc), exc, fut.traceback()))
            self.errors[orig] = (f"{type(exc).__name__}: {exc}", text)
        elif fut.status == "cancelled":
            # we pop a future before cancelling it, so this one was cancelled by Dask itself
            # (e.g. the scheduler restarted or forgot the key): fail its branches, never wait forever
            self.errored.add(orig)
            msg = f"Dask cancelled task {key!r} (scheduler restarted, or the key was released elsewhere)"
            self.errors[orig] = (f"CancelledError: {msg}", msg)
        else:
            return
        self.candidates.add(key)
        task = self._task(orig)
        self.candidates.update(self.current.get(d, d) for d in task.dependencies)
        for tip in self.key_tips.get(orig, ()):
            self._check(tip)

    # ---- choose decisions -------------------------------------------------------------
    def _decide_all(self) -> bool:
        changed = False
        for cp in self.c.chooses:
            groups: dict[Any, list[_Tip]] = defaultdict(list)
            for i in range(len(cp.inputs)):
                tip = self.choose_tips[(cp.index, i)]
                if not tip.dead:
                    groups[cp.group_of(i)].append(tip)
            for group, tips in groups.items():
                if (cp.index, group) in self.decided_groups:
                    continue
                members = {t.index for t in tips}
                metrics = {t.index: t.metric for t in tips if t.state == DONE}
                pending = [t.index for t in tips if not t.resolved]
                order = [i for i in self.completion[cp.index] if i in members]
                s = cp.spec
                d = decide(metrics, order, pending, s.mode, s.k, s.threshold)
                if d is None:
                    continue
                self.decided_groups.add((cp.index, group))
                changed = True
                for i in d.keep:
                    self.gate[(cp.index, i)] = "keep"
                for i in members - set(d.keep) - set(d.cancel):
                    self.gate[(cp.index, i)] = "drop"
                for i in d.cancel:
                    self.gate[(cp.index, i)] = "cancel"
        if changed:
            self._kill_closed()
        return changed

    def _kill_closed(self) -> None:
        for tip in self.tips:
            if tip.dead:
                continue
            closed = any(self.gate.get(g) in ("drop", "cancel") for g in tip.branch.gates)
            if tip.kind == "choose" and (tip.choose, tip.index) in self.gate:
                closed = closed or self.gate[(tip.choose, tip.index)] == "cancel"
                self.candidates.add(tip.branch.key)
            if closed:
                tip.dead = True
                self._mark(tip)
        self._release()

    # ---- releasing what no live branch needs --------------------------------------------
    def _needed(self, key: str) -> bool:
        deps_of = self.c.dependents
        for tip in self.key_tips.get(key, ()):
            if tip.dead:
                continue
            if key == tip.branch.key:
                if tip.kind == "output" and tip.state != FAILED:
                    return True
                if tip.kind == "choose" and (tip.choose, tip.index) not in self.gate and key not in self.droppable:
                    return True
            if key in self.droppable and tip.state == WAITING and key in self.finished and not self._open(tip):
                continue  # the plan drops it now and recomputes it if this branch goes ahead
            if tip.resolved:
                continue
            mk = self._metric_key(tip)
            if key == mk:
                return True
            if key == tip.branch.key and mk is not None and mk not in self.finished:
                return True
            lineage = set(tip.branch.lineage)
            if any(d in lineage and d not in self.finished for d in deps_of.get(key, ())):
                return True
        return False

    def _release(self) -> None:
        """Drop futures no live branch needs; cancel those not yet finished."""
        to_cancel = []
        for key in self.candidates:
            orig = self.alias.get(key, key)
            if key in self.futures and not self._needed(orig):
                fut = self.futures.pop(key)
                if orig not in self.finished and orig not in self.errored:
                    to_cancel.append(fut)
                elif orig in self.finished:
                    self.released.add(orig)  # needed again later: recomputed under a new key
        self.candidates.clear()
        if to_cancel:
            self.client.cancel(to_cancel)

    # ---- the loop ----------------------------------------------------------------------
    def _live(self) -> bool:
        return any(not t.resolved and not t.dead for t in self.tips)

    def run(self) -> None:
        if self.started is None:  # time to first result counts from the first submission
            self.started = time.perf_counter()
        self._submit_ready()
        while True:
            while self._decide_all():
                self._submit_ready()
            if not self._live():
                break
            try:
                key = self.events.get(timeout=0.25)
            except queue.Empty:
                self._report()
                continue
            keys = [key]
            while True:
                try:
                    keys.append(self.events.get_nowait())
                except queue.Empty:
                    break
            self._fetch_metrics(keys)  # one gather per batch, not one round trip per metric
            for key in keys:
                self._on_event(key)
            if self.abort is not None:
                raise RunError(self.abort)
            if self.first_result is not None and self.on_first_result is not None:
                hook, self.on_first_result = self.on_first_result, None
                hook(self)  # e.g. re-plan memory with the sizes measured so far
                self.candidates.update(self.futures)
            if self.on_decision is not None and self._decisions_seen != len(self.gate):
                self._decisions_seen = len(self.gate)
                self.on_decision(self)  # e.g. re-plan memory for the branches the chooses kept
                self.candidates.update(self.futures)
            self._release()
            self._report()
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if getattr(self, "publisher", None) is not None:  # graph/events.py: live branch states for the dashboard
            self.publisher.update(self, force)
        if not self.progress.enabled:
            return
        best = ""
        if self.c.chooses:
            cp = self.c.chooses[-1]
            done = [t.metric for t in self.tips if t.kind == "choose" and t.choose == cp.index and t.state == DONE]
            done = [m for m in done if m == m]
            if done:
                val = max(done) if cp.spec.mode == "max" else min(done)
                best = f"best {cp.spec.metric_name}={val:.4g}"
        considered = [t for t in self.tips if t.kind == "output"]
        self.progress.update(
            tasks_done=len(self.finished | self.errored),
            tasks_total=max(len(self.submitted), 1),
            branches_done=sum(1 for t in considered if t.resolved or t.dead),
            branches_total=len(considered),
            best=best,
            force=force,
        )

    # ---- results -------------------------------------------------------------------------
    def row_states(self) -> list[RowState]:
        rows = []
        stored = getattr(self.c, "loaded", frozenset())  # graph/store.py: results already in the store
        for tip in self.output_tips:
            b = tip.branch
            gate_tips = [self.choose_tips[g] for g in b.gates]
            failed = next((t for t in gate_tips if t.state == FAILED), None)
            if failed is None and tip.state == FAILED:
                failed = tip
            states = [self.gate.get(g) for g in b.gates]
            if failed is not None:
                status = "failed"
            elif "cancel" in states:
                status = "cancelled"
            elif "drop" in states and not self._ends_at_choose(b):
                status = "pruned"  # dropped before its remaining steps (even if a store holds them)
            elif tip.state == DONE or all(k in self.finished or k in stored for k in b.lineage):
                status = "ok"
            else:
                status = "pruned"
            rows.append(
                RowState(
                    branch=b,
                    status=status,
                    chosen=status == "ok" and all(s == "keep" for s in states),
                    metrics=[(g[0], t.metric) for g, t in zip(b.gates, gate_tips)],
                    scalars={k: v for t in gate_tips for k, v in (t.scalars or {}).items()},
                    error=failed.error if failed else None,
                    traceback=failed.traceback if failed else None,
                    failed_step=failed.failed_step if failed else None,
                    has_value=tip.state == DONE,
                )
            )
        return rows


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
) -> RunRecord:
    """Run ``compiled`` on ``client`` and return a :class:`RunRecord`.

    ``store``: a directory (or ``graph.store.ResultStore``) of results kept across runs.
    ``memory_budget``: total bytes for all workers (``"2 GiB"``): the run is planned
    (``graph.memory.plan``) and the plan installed on the workers (``graph.memory.budget``).
    ``sample_sizes``: run the first branch alone first and plan with its measured sizes.
    ``order``: ``"depth-first"`` (Quiver's priorities) or ``"dask"`` (Dask's own ordering).
    ``disk_bandwidth``: bytes/s the plan assumes for spilling (default: measured on a worker).
    """
    if order not in ("depth-first", "dask"):
        raise ValueError(f"order must be 'depth-first' or 'dask', not {order!r}")
    start = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    # ---- graph transforms (graph/store.py): result store, not-rerunnable steps ----
    from .store import prepare

    plan = prepare(compiled, store, run_id)
    compiled = plan.compiled
    # -------------------------------------------------------------------------------
    monitor = RunMonitor(run_id, list(compiled.graph) + list(compiled.metric_graph))
    client.register_plugin(monitor)
    bar = Progress(enabled=progress)
    ex = _Execution(compiled, client, bar, depth_first=order == "depth-first")
    # ---- graph/dashboard.py, graph/events.py: the dashboard pages, published branch states, training line ----
    ensure_dashboard(client)
    ex.publisher = ExplorationPublisher(client, run_id, compiled)
    ex.publisher.start()
    watch = TrainingWatch(client, bar)
    # -------------------------------------------------------------------------------
    budgeted = None
    try:
        budgeted = BudgetedRun(
            client, memory_budget, sample=sample_sizes, run_id=run_id, disk_bandwidth=disk_bandwidth
        )
        budgeted.start(ex, monitor.name)  # plans, and marks what may be dropped and recomputed
        ex.run()
        rows = ex.row_states()
        ok_keys = [r.branch.key for r in rows if r.has_value]
        values = dict(zip(ok_keys, client.gather([ex.futures[k] for k in ok_keys]))) if ok_keys else {}
        snap = client.run_on_scheduler(snapshot_on_scheduler, name=monitor.name)
        budget_stats = budgeted.stats(snap, compiled)
    finally:
        if sys.exc_info()[1] is not None:  # the run stopped early: say so on the dashboard
            ex.publisher.finish([], error=f"{type(sys.exc_info()[1]).__name__}: {sys.exc_info()[1]}")
        watch.close()
        if budgeted is not None:
            budgeted.close()
        bar.close()
        ex.futures.clear()
        try:
            client.unregister_scheduler_plugin(monitor.name)
        except Exception:  # the scheduler may be gone; nothing left to clean
            pass
    table, kept = build_table(compiled, rows, values, snap.get("seconds", {}))
    executed = snap.get("executed", {})
    stats = {
        "naive_tasks": compiled.naive_tasks,
        "unique_tasks": compiled.unique_tasks,
        "executed_tasks": sum(n for k, n in executed.items() if k in compiled.graph),
        "metric_tasks": sum(n for k, n in executed.items() if k in compiled.metric_graph),
        "branches": len(rows),
        "failed_branches": sum(r.status == "failed" for r in rows),
        "peak_memory_bytes": snap.get("peak_memory_bytes", 0),
        "peak_worker_memory_bytes": snap.get("peak_worker_memory_bytes", 0),
        "wall_seconds": time.perf_counter() - start,
        "first_result_seconds": ex.first_result,
    }
    stats.update(budget_stats)  # spilled/read-back bytes, recomputed tasks, plan vs measured
    stats.update(plan.finish(client, executed))  # graph/store.py: loads are not executions
    ex.publisher.finish(rows, stats)  # graph/events.py: final statuses for the dashboard
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
