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
import time
import traceback as tb_module
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client, Future

from .compiler import CompiledPipeline
from .errors import RunError
from .monitor import RunMonitor, snapshot_on_scheduler
from .progress import Progress
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


class _Execution:
    def __init__(self, compiled: CompiledPipeline, client: Client, progress: Progress):
        self.c = compiled
        self.client = client
        self.progress = progress
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

    def _submit_ready(self) -> None:
        dsk: dict[str, Any] = {}
        priority: dict[str, int] = {}
        ready = []
        for tip in self.tips:
            if tip.state != WAITING or tip.dead or not self._open(tip):
                continue
            p = self._priority(tip)
            mk = self._metric_key(tip)
            for k in tip.branch.lineage + ((mk,) if mk else ()):
                if k in self.submitted:
                    continue
                dsk[k] = self.c.graph[k] if k in self.c.graph else self.c.metric_graph[k]
                priority[k] = max(priority.get(k, p), p)
            tip.state = SUBMITTED
            ready.append(tip)
        if dsk:
            layer = MaterializedLayer(dsk, annotations={"priority": priority.__getitem__})
            hlg = HighLevelGraph({f"quiver-{uuid.uuid4().hex[:8]}": layer}, {})
            hlg.dependencies = {name: set() for name in hlg.layers}
            futures = self.client.get(hlg, list(dsk), sync=False)
            for fut in futures:
                self.futures[fut.key] = fut
                self.submitted.add(fut.key)
                fut.add_done_callback(lambda f: self.events.put(f.key))
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

    def _on_event(self, key: str) -> None:
        fut = self.futures.get(key)
        if fut is None:
            return
        if fut.status == "finished":
            self.finished.add(key)
            if key in self.c.metric_graph:
                self.metric_values[key] = fut.result()
        elif fut.status == "error":
            self.errored.add(key)
            exc = fut.exception()
            text = "".join(tb_module.format_exception(type(exc), exc, fut.traceback()))
            self.errors[key] = (f"{type(exc).__name__}: {exc}", text)
        elif fut.status == "cancelled":
            # we pop a future before cancelling it, so this one was cancelled by Dask itself
            # (e.g. the scheduler restarted or forgot the key): fail its branches, never wait forever
            self.errored.add(key)
            msg = f"Dask cancelled task {key!r} (scheduler restarted, or the key was released elsewhere)"
            self.errors[key] = (f"CancelledError: {msg}", msg)
        else:
            return
        self.candidates.add(key)
        task = self.c.graph.get(key) or self.c.metric_graph[key]
        self.candidates.update(task.dependencies)
        for tip in self.key_tips.get(key, ()):
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
                if tip.kind == "choose" and (tip.choose, tip.index) not in self.gate:
                    return True
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
            if key in self.futures and not self._needed(key):
                fut = self.futures.pop(key)
                if key not in self.finished and key not in self.errored:
                    to_cancel.append(fut)
        self.candidates.clear()
        if to_cancel:
            self.client.cancel(to_cancel)

    # ---- the loop ----------------------------------------------------------------------
    def _live(self) -> bool:
        return any(not t.resolved and not t.dead for t in self.tips)

    def run(self) -> None:
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
            self._on_event(key)
            while True:
                try:
                    self._on_event(self.events.get_nowait())
                except queue.Empty:
                    break
            self._release()
            self._report()
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
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
            elif tip.state == DONE or all(k in self.finished for k in b.lineage):
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
) -> RunRecord:
    """Run ``compiled`` on ``client`` and return a :class:`RunRecord`."""
    start = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    monitor = RunMonitor(run_id, list(compiled.graph) + list(compiled.metric_graph))
    client.register_plugin(monitor)
    bar = Progress(enabled=progress)
    ex = _Execution(compiled, client, bar)
    try:
        ex.run()
        rows = ex.row_states()
        ok_keys = [r.branch.key for r in rows if r.has_value]
        values = dict(zip(ok_keys, client.gather([ex.futures[k] for k in ok_keys]))) if ok_keys else {}
        snap = client.run_on_scheduler(snapshot_on_scheduler, name=monitor.name)
    finally:
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
        "spilled_bytes": snap.get("spilled_bytes", 0),
        "wall_seconds": time.perf_counter() - start,
    }
    if raise_if_all_failed and rows and all(r.status == "failed" for r in rows):
        first = rows[0]
        raise RunError(
            f"every branch failed ({len(rows)} of {len(rows)}); the first failed in step "
            f"{first.failed_step!r} with {first.error}. See the .table attribute of this "
            "error for each branch's error and traceback.",
            table=table,
        )
    return RunRecord(table=table, values=kept, single=compiled.single_value, stats=stats, compiled=compiled)
