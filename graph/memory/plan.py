"""The memory plan: what stays in memory, what goes to disk, what is recomputed.

An exploration is known before it runs, so every intermediate's future uses are
known too.  :func:`plan_memory` walks the graph in the order the executor runs
it (depth-first, stage by stage up to each choose; a root-ish source's partitions across
sibling branches, as Dask runs them: :mod:`graph.memory.interleave`), holds each result exactly
until its last use, and whenever the results held would exceed the budget it
evicts the one needed *furthest in the future* (Belady's rule, not LRU).  An
evicted result is spilled to disk until its next use, or dropped and recomputed
there when recomputing is cheaper than a disk round trip.  The plan is a plain
value: print it, test it, and compare it with what a run measured.

>>> from graph.spec import SourceSpec, ExploreSpec, Alternative, Call
>>> def load(): return b"x" * 100
>>> def scale(x, f): return x * f
>>> src = SourceSpec("demo", Call(load, (), "load", size_hint=100))
>>> alts = tuple(Alternative(f"x{f}", Call(scale, (("f", f),), "scale", size_hint=100 * f)) for f in (1, 2))
>>> from graph.compiling.compiler import compile_spec
>>> plan = plan_memory(compile_spec(ExploreSpec(src, "f", alts)), budget=1000, workers=1, baseline=0)
>>> plan.fits, plan.predicted_data_peak
(True, 400)
>>> [d.action for d in plan.decisions.values()]
['keep', 'keep', 'keep']
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PipelineError
from ..state.order import run_order, run_targets  # the one run order (the executor's priorities too)
from ..walk import postorder
from .cost import KEEP, RECOMPUTE, SPILL, decide
from .interleave import dask_ranks, interleave, rootish_groups
from .limits import Thresholds, dask_thresholds, data_share, worker_limits
from .sizes import SizeEstimates, format_bytes, parse_bytes, step_of
from .working import by_step, temporaries, working_of

__all__ = [
    "NoRoomForResults",
    "Decision",
    "MemoryPlan",
    "execution_order",
    "plan_memory",
    "compare_with_run",
    "why_text",
    "KEEP",
    "SPILL",
    "RECOMPUTE",
    "DEFAULT_BASELINE",
    "DEFAULT_DISK_BANDWIDTH",
]

# the decisions and the rule that makes them: graph.memory.cost (one owner)
#: assumed memory of an idle worker process (Python, NumPy, Dask) when none is measured
DEFAULT_BASELINE = 160 * 2**20
#: assumed disk throughput (bytes/s) when deciding spill vs recompute
DEFAULT_DISK_BANDWIDTH = 300e6


@dataclass(frozen=True)
class Decision:
    """The plan for one intermediate.

    ``action``: ``keep`` (in memory from creation to last use), ``spill`` (written to
    disk when room is needed, read back at its next use) or ``recompute`` (dropped,
    recomputed under a distinct key for its later uses).  ``uses``: positions in the
    plan's ``order`` of the tasks that read it (``len(order)`` for the final gather).
    """

    key: str
    nbytes: int
    source: str
    action: str
    uses: tuple[int, ...]
    evicted_at: int | None = None

    @property
    def step(self) -> str:
        return step_of(self.key)


@dataclass
class MemoryPlan:
    """A plan for running one compiled exploration inside ``budget`` bytes (all workers)."""

    budget: int
    workers: int
    baseline: int
    worker_data_budget: int
    order: tuple[str, ...]
    decisions: dict[str, Decision]
    predicted_data_peak: int
    spill_bytes: int
    read_bytes: int
    recomputed: int
    estimated_keys: dict[str, int] = field(default_factory=dict)  # how many sizes came from each source
    too_big: list[str] = field(default_factory=list)  # steps over a worker's share (non-strict re-plans)
    thresholds: Thresholds = field(default_factory=Thresholds)  # Dask's, that the share was computed with
    working: dict = field(default_factory=dict)  # measured working memory per key (graph.memory.working)
    predicted_working_peak: int = 0  # results held plus the running task's temporaries, at the worst moment
    second_passes: bool = False  # planned with second passes' copies (graph/state/secondpass.py)
    recompute_seconds: float = 0.0  # the measured seconds the planned recomputations cost (graph.memory.cost)
    views: int = 0  # results sharing an input's memory (slices, transposes, aliases): counted once
    after_run: str = ""  # once the run is over: planned against Dask's spills and recomputations (why_text)

    @property
    def evicts(self) -> bool:
        """Whether the plan takes anything out of memory before its last use (spills or drops it),
        or found a step too big for a worker. ``False``: every result fits in its worker's share
        from creation to last use, so Dask's own spill settings need no change (the cheap path).

        >>> MemoryPlan(budget=1, workers=1, baseline=0, worker_data_budget=1, order=(), decisions={},
        ...            predicted_data_peak=0, spill_bytes=0, read_bytes=0, recomputed=0).evicts
        False
        """
        return bool(self.too_big) or any(d.action != KEEP for d in self.decisions.values()) or self.spill_bytes > 0

    @property
    def predicted_peak(self) -> int:
        """Predicted total process memory: every worker idle memory plus, at its worst moment, the
        results it holds and the temporaries of the task it runs (measured working memory less
        the result: :func:`graph.memory.working.temporaries`); each worker is modelled as
        holding up to its own share."""
        return (self.baseline + max(self.predicted_data_peak, self.predicted_working_peak)) * self.workers

    @property
    def fits(self) -> bool:
        return self.predicted_peak <= self.budget

    @property
    def worker_memory_limit(self) -> int:
        return self.budget // self.workers

    def positions(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self.order)}

    def next_uses(self) -> dict[str, tuple[int, ...]]:
        """For each key, the positions at which it is read: what workers evict by."""
        return {k: d.uses for k, d in self.decisions.items()}

    def count(self, action: str) -> int:
        return sum(1 for d in self.decisions.values() if d.action == action)

    def summary(self) -> dict[str, Any]:
        return {
            "memory_budget_bytes": self.budget,
            "predicted_peak_bytes": self.predicted_peak,
            "predicted_data_peak_bytes": self.predicted_data_peak,
            "predicted_working_peak_bytes": max(self.predicted_data_peak, self.predicted_working_peak),
            "predicted_spill_bytes": self.spill_bytes,
            "predicted_recomputed_tasks": self.recomputed,
            "predicted_recompute_seconds": self.recompute_seconds,
            "planned_views": self.views,
            "planned_keep": self.count(KEEP),
            "planned_spill": self.count(SPILL),
            "planned_recompute": self.count(RECOMPUTE),
        }

    def __str__(self) -> str:
        head = (
            f"Memory plan: budget {format_bytes(self.budget)} over {self.workers} worker(s) "
            f"({format_bytes(self.worker_memory_limit)} each; results may use "
            f"{format_bytes(self.worker_data_budget)} of it beside an idle worker's "
            f"{format_bytes(self.baseline)})\n"
            f"  predicted peak {format_bytes(self.predicted_peak)} "
            f"({'fits' if self.fits else 'OVER BUDGET'}); results held per worker at most "
            f"{format_bytes(self.predicted_data_peak)}"
            + (f", with the running step's temporaries {format_bytes(self.predicted_working_peak)}"
               if self.predicted_working_peak > self.predicted_data_peak else "")
            + "\n"
            f"  {self.count(KEEP)} kept, {self.count(SPILL)} spilled "
            f"({format_bytes(self.spill_bytes)} written, {format_bytes(self.read_bytes)} read back), "
            f"{self.count(RECOMPUTE)} recomputed"
            + (f" ({self.recompute_seconds:.1f} s of measured compute, cheaper than the disk round trip)"
               if self.recompute_seconds else "")
            + (f"; {self.views} views or aliases of an input counted once (no bytes of their own, never spilled)"
               if self.views else "")
            + "; sizes: "
            + ", ".join(f"{n} {src}" for src, n in sorted(self.estimated_keys.items()))
        )
        rows = [f"  {'step':<24} {'size':>10} {'from':<8} {'action':<9} uses (of {len(self.order)} tasks)"]
        for d in sorted(self.decisions.values(), key=lambda d: (d.action == KEEP, -d.nbytes)):
            uses = ",".join(str(u) for u in d.uses[:6]) + ("..." if len(d.uses) > 6 else "")
            rows.append(f"  {d.step[:24]:<24} {format_bytes(d.nbytes):>10} {d.source:<8} {d.action:<9} {uses}")
            if len(rows) > 40:
                rows.append(f"  ... {len(self.decisions) - 40} more")
                break
        tail = f"\n  after the run: {self.after_run}" if self.after_run else ""
        return head + tail + "\n" + "\n".join(rows)

    @property
    def droppable(self) -> frozenset[str]:
        """Keys the run may release early and recompute on demand (``recompute`` decisions)."""
        return frozenset(k for k, d in self.decisions.items() if d.action == RECOMPUTE)


@dataclass
class _Schedule:
    order: list[str]
    held: set[str]  # gathered at the end
    hold_until: dict[str, float]  # kept for a choose that may still want them, then released
    keep_chance: dict[str, float]  # for held-only keys: how likely a choose keeps a branch needing them


def _assumed_kept(cp: Any, decided: Mapping[tuple[int, int], str] | None = None) -> tuple[set[int], dict[int, float]]:
    """Which inputs of a choose the plan assumes it keeps, and each input's chance of being
    kept: the choose's own decision where it has made one, else the first ``k`` of each group
    (all of them for a plain threshold, which can keep any number)."""
    decided = decided or {}
    groups: dict[Any, list[int]] = {}
    for i in range(len(cp.inputs)):
        groups.setdefault(cp.group_of(i), []).append(i)
    kept: set[int] = set()
    chance: dict[int, float] = {}
    for members in groups.values():
        if any((cp.index, i) in decided for i in members):
            for i in members:
                keep = decided.get((cp.index, i)) == "keep"
                chance[i] = 1.0 if keep else 0.0
                if keep:
                    kept.add(i)
        elif cp.spec.k is None:
            kept.update(members)
            chance.update({i: 1.0 for i in members})
        else:
            kept.update(members[: cp.spec.k])
            chance.update({i: min(1.0, cp.spec.k / len(members)) for i in members})
    return kept, chance


def execution_order(compiled: Any, decided: Mapping[tuple[int, int], str] | None = None,
                    threads: int = 1) -> _Schedule:
    """The order the executor runs tasks in, as the plan models it.

    Stage by stage (branches behind fewer chooses first, as the executor opens them),
    in declaration order, each branch depth-first (a task right after its inputs); within a
    stage, partitions of a root-ish source run across sibling branches as Dask runs them
    (:func:`graph.memory.interleave.interleave`; ``threads``: the cluster's, for Dask's
    root-ish rule; one by default, as :func:`plan_memory`'s one worker).
    Behind a choose the plan follows its decision (``decided``: the executor's gates,
    ``{(choose, input): "keep" | "drop" | "cancel"}``) or, before it decides, assumes its
    first ``k`` inputs (per group) are kept; the other branches' inputs are only held
    until the choose decides.
    """
    assumed = {cp.index: _assumed_kept(cp, decided) for cp in compiled.chooses}
    kept = {c: a[0] for c, a in assumed.items()}
    tips = [(t.kind == "output", list(t.keys), t.branch.gates) for t in run_order(run_targets(compiled))]

    def deps(key: str):
        task = compiled.graph.get(key) or compiled.metric_graph[key]
        return task.dependencies

    order: list[str] = []
    seen: set[str] = set()

    def visit(key: str) -> None:
        # keys: str, or tuples (partitions); the smallest dependency is visited first
        order.extend(postorder([key], lambda k: sorted(deps(k), key=str, reverse=True), seen))

    excluded: list[tuple[list[str], tuple]] = []
    held: set[str] = set()
    stage_starts: dict[int, int] = {}  # stage -> where its tasks start in the order
    for is_output, keys, gates in tips:
        if all(i in kept[c] for c, i in gates):
            stage_starts.setdefault(len(gates), len(order))
            for k in keys:
                visit(k)
            if is_output:
                held.add(keys[-1])
        else:
            excluded.append((keys, gates))
    # each stage is one submission: Dask runs its partitions across sibling branches (interleave.py)
    rootish = rootish_groups(order, deps, threads)
    parts = _partitions(compiled, order)
    if rootish or parts:
        bounds = sorted(stage_starts.values()) + [len(order)]
        staged = []
        for a, b in zip(bounds, bounds[1:]):
            stage = order[a:b]
            inside = [k for k in stage if k in parts]
            tie = dask_ranks(inside, deps) if inside else None  # partitions: one priority, Dask's order
            staged.extend(interleave(stage, deps, threads, rootish, tie=tie))
        order = staged
    pos = {k: i for i, k in enumerate(order)}
    decide_at = {
        cp.index: max((pos[m] for m in cp.metric_keys if m in pos), default=-1) + 0.5 for cp in compiled.chooses
    }
    hold_until: dict[str, float] = {}
    keep_chance: dict[str, float] = {}
    for keys, gates in excluded:
        c_drop, i_drop = next((c, i) for c, i in gates if i not in kept[c])
        if assumed[c_drop][1].get(i_drop, 0.0) == 0.0:
            continue  # the choose has dropped this branch: nothing holds its inputs for it
        for k in keys:
            if k in pos:
                hold_until[k] = max(hold_until.get(k, -1.0), decide_at[c_drop])
                keep_chance[k] = max(keep_chance.get(k, 0.0), assumed[c_drop][1][i_drop])
    return _Schedule(order, held, hold_until, keep_chance)


def _partitions(compiled: Any, order: list) -> set:
    """The keys of ``order`` that are a collection's tasks (a second pass's copies included): they
    run at their stage's one priority, in Dask's own order (graph.state.order.stage_priority)."""
    from ..keys import original_key

    steps = getattr(compiled, "step_of", None) or {}
    return {k for k in order if original_key(k) in steps} if steps else set()


def plan_memory(
    compiled: Any,
    budget: Any,
    *,
    workers: int = 1,
    threads: int | None = None,
    baseline: int | None = None,
    sizes: SizeEstimates | Mapping[str, int] | None = None,
    seconds: Mapping[str, float] | None = None,
    disk_bandwidth: float = DEFAULT_DISK_BANDWIDTH,
    default_size: int = 1 << 20,
    decided: Mapping[tuple[int, int], str] | None = None,
    strict: bool = True,
    thresholds: Thresholds | None = None,
    working: Mapping[Any, int] | None = None,
    second_passes: bool = False,
    monitor_margin: bool = False,
) -> MemoryPlan:
    """Plan ``compiled`` for ``budget`` bytes in all (``"2 GiB"`` or an int), split over ``workers``.

    ``threads``: the cluster's threads (default one per worker), for Dask's root-ish rule in the
    modelled order (:mod:`graph.memory.interleave`).
    ``baseline``: memory of an idle worker process (measured by the executor; a
    default otherwise).  ``sizes``: estimated bytes per key (a ``SizeEstimates``,
    or measured sizes; the compiled ``size_hints`` are used too).  ``seconds``:
    measured compute seconds per key; without them nothing is planned for
    recomputation (spilling is the safe default).

    ``decided``: the chooses' decisions so far (a re-plan during a run).
    ``thresholds``: Dask's worker memory thresholds (default: ``dask.config``'s).
    ``working``: measured working memory per key (what a task's worker rose by while it ran;
    a step's other instances get its largest). A task's temporaries (working memory less its
    result) count toward the peak while it runs, and the plan makes room for those that would
    pass Dask's spill line (where its memory monitor would write held results), so neither happens.
    ``second_passes``: ``compiled`` holds second passes' copies, as a run whose data do not fit
    runs them (graph/state/secondpass.py; graph/memory/budget.py makes it); recorded in the plan.
    ``monitor_margin``: results may fill a worker only up to Dask's ``target`` line, not its ``spill``
    line (a run's budget asks for it): memory no plan sees (a task's inputs read back, transfer
    buffers, allocator slack) then has the band between them before Dask's memory monitor acts,
    which, once it does, writes held results down to ``target`` in any case.

    Raises ``PipelineError`` when a single step needs more than one worker's share
    of the budget (its inputs and its output together), naming the step and sizes;
    with ``strict=False`` such steps are listed in ``MemoryPlan.too_big`` instead.
    """
    budget = parse_bytes(budget)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    baseline = DEFAULT_BASELINE if baseline is None else int(baseline)
    thresholds = dask_thresholds() if thresholds is None else thresholds
    worker_data = room = _room_for_results(budget, workers, baseline, thresholds)
    if monitor_margin:
        worker_data = _below_target(worker_data, budget, workers, thresholds)
    est = _estimates(compiled, sizes, default_size)
    sched = execution_order(compiled, decided, threads=threads or workers)
    walk = _Belady(compiled, sched, est, dict(seconds or {}), disk_bandwidth, worker_data)
    walk.room = room  # what a single step may need (the margin is for eviction, not a refusal)
    working = dict(working or {})
    steps = by_step(working)
    limit = worker_limits(budget, workers)
    walk.temps = {k: temporaries(working_of(k, working, steps), walk.size[k]) for k in walk.order} if working else {}
    # temporaries need room under the spill line, not the pause line: past it Dask's memory monitor
    # writes held results to disk (by process memory, every 100 ms) down to its target, which on
    # issue 46's ridge (2 x 640 MiB) wrote 16.8 GiB the plan never planned while results filled
    # the share to the spill line
    walk.headroom = 0
    walk.run(lambda k, inputs, need: _step_fits(k, inputs, need, walk, est, strict, budget, workers, baseline))
    plan = walk.plan(budget, workers, baseline, thresholds)
    plan.working = working
    plan.second_passes = bool(second_passes)
    return plan


class NoRoomForResults(PipelineError):
    """The budget leaves a worker no room for results beside its idle memory (a definition error:
    raised before anything runs)."""


def _room_for_results(budget: int, workers: int, baseline: int, thresholds: Thresholds) -> int:
    """One worker's bytes for results (:func:`graph.memory.limits.data_share`); refused when none."""
    worker_data = data_share(budget, workers=workers, baseline=baseline, thresholds=thresholds)
    if worker_data <= 0:
        per_worker = worker_limits(budget, workers)
        frac = thresholds.results_fraction
        raise NoRoomForResults(
            f"memory budget {format_bytes(budget)} over {workers} worker(s) leaves no room for results: "
            f"each worker gets {format_bytes(per_worker)}, of which {format_bytes(int(per_worker * frac))} "
            f"({frac:.0%}) before Dask starts spilling, and an idle worker already uses about {format_bytes(baseline)}. "
            "Raise memory_budget or use fewer workers."
        )
    return worker_data


def _below_target(worker_data: int, budget: int, workers: int, thresholds: Thresholds) -> int:
    """The room for results less the band between Dask's ``target`` and ``spill`` lines (never less
    than half the room). Issue 46's ridge filled a worker's room to its spill line (448 MiB of 640:
    idle 181 + results 267); process memory reached 458-464 MiB, and the memory monitor wrote
    16.7 GiB of results the plan meant to hold, down to ``target`` each time.

    >>> M = 2**20
    >>> _below_target(267 * M, 1280 * M, 2, Thresholds()) // M     # 640 MiB workers: 64 MiB band
    203
    """
    t, s = thresholds.target, thresholds.spill
    if t in (False, None) or s in (False, None) or float(t) >= float(s):
        return worker_data
    band = int(worker_limits(budget, workers) * (float(s) - float(t)))
    return max(worker_data - band, worker_data // 2)


def _estimates(compiled: Any, sizes: SizeEstimates | Mapping[str, int] | None, default_size: int) -> SizeEstimates:
    """The size estimates the plan reads: the given ones, with the compiled size hints."""
    if isinstance(sizes, SizeEstimates):
        for k, n in compiled.size_hints.items():
            sizes.hints.setdefault(k, n)
        return sizes
    return SizeEstimates(hints=compiled.size_hints, measured=sizes or {}, default=default_size)


def _step_fits(key: str, inputs: list, need: int, walk: "_Belady", est: SizeEstimates, strict: bool,
               budget: int, workers: int, baseline: int) -> None:
    """A step whose inputs and output cannot fit in one worker's share: refused (``strict``) or listed."""
    if need <= max(walk.capacity, walk.room):
        return
    from ..keys import original_key

    if original_key(key) != key:  # a copy (a second pass's, a recompute's): its original was judged;
        return  # a copy's root also waits for the reductions it gates on, sized by default before they run
    if not strict:
        walk.too_big.append(key)
        return
    size = walk.size
    parts = ", ".join(f"{step_of(d)} {format_bytes(size[d])}" for d in inputs)
    raise PipelineError(
        f"step {step_of(key)!r} cannot fit in one worker's share of the memory budget: its output "
        f"(~{format_bytes(size[key])}, {est.source(key)})"
        + (f" and inputs ({parts})" if inputs else "")
        + f" need {format_bytes(need)}, but each of the {workers} worker(s) has "
        f"{format_bytes(walk.capacity)} for results ({format_bytes(worker_limits(budget, workers))} per worker, less "
        f"an idle worker's {format_bytes(baseline)}). Raise memory_budget, use fewer workers, "
        "or split the step so it produces smaller pieces."
    )


class _Belady:
    """One worker running the whole order with its own share (shared inputs are copied to every
    worker that reads them, so this is what one worker can be asked to hold): holds each result
    until its death, and when room is needed evicts the result read furthest in the future,
    spilling it or planning to recompute it, whichever costs less."""

    def __init__(self, compiled: Any, sched: _Schedule, est: SizeEstimates, seconds: dict[str, float],
                 disk_bandwidth: float, capacity: int):
        self.compiled, self.sched, self.est = compiled, sched, est
        self.seconds, self.disk_bandwidth, self.capacity = seconds, disk_bandwidth, capacity
        self.order = sched.order
        self.uses = _uses(compiled, sched)
        self.size = {k: est.get(k) for k in self.order}
        # a view or alias of an input (a slice, a transpose, da.concatenate's pass-through block)
        # holds no bytes of its own: it costs nothing, keeps its owner alive while it lives, and
        # only the owner is ever evicted (writing a view to disk frees nothing)
        self.views = _views(self.order, self.deps_task, self.size)
        for v, owner in self.views.items():
            self.size[v] = 0
            if owner in self.uses:
                self.uses[owner] = sorted(set(self.uses[owner]) | set(self.uses[v]))
        self.step_seconds: dict[str, float] = {}
        self.layer_seconds: dict[Any, float] = {}  # a partition's layer: its siblings' seconds are the closest
        for k, v in seconds.items():
            self.step_seconds[step_of(k)] = max(self.step_seconds.get(step_of(k), 0.0), v)
            if isinstance(k, tuple) and k:
                self.layer_seconds[k[0]] = max(self.layer_seconds.get(k[0], 0.0), v)
        self.costs: dict[str, float] = {}
        # a result is alive while a later task reads it or a choose may still want it: until its
        # death (its last use, or the end of its hold); the walk releases it at the first step past
        # that, from a bucket per step, so a step costs what it releases, not a scan of the resident
        hold = sched.hold_until
        self.death = {k: max(float(self.uses[k][-1]) if self.uses[k] else -1.0, hold.get(k, -1.0)) for k in self.order}
        self.due: dict[int, list[str]] = {}
        # eviction candidates, furthest next use first, then largest, then longest resident: a heap
        # of (-next use, -size, residency number, key) whose entries go stale when the key leaves
        # memory (its residency number changes) or is read (a fresh entry is pushed after the step)
        self.ranks: list = []
        self.residency: dict[str, int] = {}
        self.counter = itertools.count()
        self.too_big: list[str] = []
        self.resident: dict[str, int] = {}
        self.on_disk: set[str] = set()
        self.action: dict[str, str] = {}
        self.evicted_at: dict[str, int] = {}
        self.tally = {"total": 0, "peak": 0, "spill": 0, "read": 0, "recomputed": 0, "working": 0, "recompute_s": 0.0}
        self.temps: dict[str, int] = {}  # key -> its temporaries while it runs (measured working memory)
        self.room = capacity  # a step needing more than this is refused (plan_memory may set it above capacity)
        self.headroom = 0  # temporaries up to it need no room (0: they need it under the spill line)

    def deps_task(self, key: str):
        return self.compiled.graph.get(key) or self.compiled.metric_graph[key]

    def deps(self, key: str):
        return self.deps_task(key).dependencies

    def cost(self, key: str) -> float:
        if key not in self.costs:
            if key in self.seconds:
                self.costs[key] = self.seconds[key]
            elif isinstance(key, tuple) and key and key[0] in self.layer_seconds:
                self.costs[key] = self.layer_seconds[key[0]]
            else:
                self.costs[key] = self.step_seconds.get(step_of(key), math.inf)
        return self.costs[key]

    def next_use(self, key: str, t: float) -> int | None:
        u = self.uses[key]
        i = bisect.bisect_right(u, t)
        return u[i] if i < len(u) else None

    def rank_entry(self, key: str, t: int) -> tuple:
        n = self.next_use(key, t)
        return (-(math.inf if n is None else n), -self.resident[key], self.residency[key], key)

    def resident_from(self, key: str, t: int) -> None:
        """``key`` became resident at step ``t``: rank it, and check it again when it dies."""
        self.residency[key] = next(self.counter)
        heapq.heappush(self.ranks, self.rank_entry(key, t))
        self.due.setdefault(max(t, math.ceil(self.death[key])), []).append(key)

    def add(self, key: str, t: int) -> None:
        self.resident[key] = self.size[key]
        self.resident_from(key, t)
        self.tally["total"] += self.size[key]
        self.tally["peak"] = max(self.tally["peak"], self.tally["total"])

    def chain_cost(self, key: str) -> float:
        """Seconds to recompute ``key`` from what will still be in memory or on disk
        (iterative: a chain thousands of steps deep must not hit Python's recursion limit)."""
        c, stack, seen = 0.0, [key], set()
        while stack:
            k = stack.pop()
            c += self.cost(k)
            if c == math.inf:  # unknown cost: nothing further changes the answer
                return c
            for d in self.deps(k):
                if d in self.resident or d in self.on_disk or d in seen:
                    continue
                seen.add(d)
                stack.append(d)
        return c

    def bring(self, key: str, t: int) -> None:
        """Make ``key`` resident: read it back, or recompute it (and what it needs first)."""
        stack = [(key, False)]
        while stack:
            k, inputs_ready = stack.pop()
            if k in self.resident:
                continue
            if k in self.on_disk:
                self.on_disk.discard(k)
                self.tally["read"] += self.size[k]
            elif not inputs_ready:
                stack.append((k, True))  # come back once what it needs is resident
                stack.extend((d, False) for d in self.deps(k) if d not in self.resident)
                continue
            else:
                self.tally["recomputed"] += 1
            self.add(k, t)

    def victim(self, protected: set[str], t: int) -> str | None:
        """The resident result read furthest in the future (Belady), skipping stale entries."""
        v, aside = None, []
        while self.ranks:
            entry = heapq.heappop(self.ranks)
            r = entry[3]
            if r not in self.resident or self.residency.get(r) != entry[2] or entry != self.rank_entry(r, t):
                continue
            if r in protected:
                aside.append(entry)
                continue
            if not self.resident[r]:  # a view: evicting it frees nothing
                continue
            v = r
            break
        for entry in aside:
            heapq.heappush(self.ranks, entry)
        return v

    def evict(self, v: str, t: int) -> None:
        """Take ``v`` out of memory: to disk, or dropped to be recomputed, whichever costs less."""
        size = self.size[v]
        nu = self.next_use(v, t)
        self.tally["total"] -= self.resident.pop(v)
        self.evicted_at.setdefault(v, t)
        # only held in case an undecided choose keeps its branch (no next read): read back, or
        # recomputed, with the chance p that it keeps it (graph.memory.cost: the one rule)
        p = self.sched.keep_chance.get(v, 1.0) if nu is None else 1.0
        chain = self.chain_cost(v) if self.action.get(v) != SPILL else math.inf
        if decide(size, chain, self.disk_bandwidth, reads=p) == RECOMPUTE:
            self.action[v] = RECOMPUTE
            self.tally["recompute_s"] += p * chain
            return
        self.action[v] = SPILL
        self.on_disk.add(v)
        self.tally["spill"] += size

    def make_room(self, nbytes: int, protected: set[str], t: int) -> None:
        while self.tally["total"] + nbytes > self.capacity:
            v = self.victim(protected, t)
            if v is None:
                return
            self.evict(v, t)

    def release_dead(self, t: int) -> None:
        """Release what nothing reads or holds any more."""
        for r in self.due.pop(t, ()):
            if self.death[r] <= t:
                if r in self.resident:
                    self.tally["total"] -= self.resident.pop(r)
                self.on_disk.discard(r)

    def run(self, check: Any) -> None:
        """Walk the order; ``check(key, inputs, bytes needed)`` sees each step before it runs."""
        size = self.size
        for t, k in enumerate(self.order):
            inputs = list(self.deps(k))
            check(k, inputs, size[k] + sum(size[d] for d in inputs))
            for d in inputs:
                if d not in self.resident:
                    self.make_room(size[d], set(inputs), t)
                    self.bring(d, t)
            temp = self.temps.get(k, 0)
            self.make_room(size[k] + max(temp - self.headroom, 0), set(inputs), t)
            if k not in self.resident:
                self.add(k, t)
            else:  # recomputed as an input earlier at this step: counted again, as before
                self.tally["total"] += size[k]
                self.tally["peak"] = max(self.tally["peak"], self.tally["total"])
            self.tally["working"] = max(self.tally["working"], self.tally["total"] + temp)
            for d in inputs:  # read at t: ranked by their next use after t (a view's owner too)
                for r in (d, self.views.get(d)):
                    if r is not None and r in self.resident:
                        heapq.heappush(self.ranks, self.rank_entry(r, t))
            self.release_dead(t)

    def plan(self, budget: int, workers: int, baseline: int, thresholds: Thresholds) -> MemoryPlan:
        c, est, uses, hold = self.compiled, self.est, self.uses, self.sched.hold_until
        sources: dict[str, int] = {}
        for k in self.order:
            if k in c.graph:
                src = "view" if k in self.views else est.source(k)
                sources[src] = sources.get(src, 0) + 1
        decisions = {
            k: Decision(k, self.size[k], "view" if k in self.views else est.source(k), self.action.get(k, KEEP),
                        tuple(uses[k]), self.evicted_at.get(k))
            for k in self.order
            if k in c.graph and (uses[k] or k in hold)
        }
        return MemoryPlan(
            budget=budget,
            workers=workers,
            baseline=baseline,
            worker_data_budget=self.capacity,
            order=tuple(self.order),
            decisions=decisions,
            predicted_data_peak=self.tally["peak"],
            spill_bytes=self.tally["spill"],
            read_bytes=self.tally["read"],
            recomputed=self.tally["recomputed"],
            recompute_seconds=self.tally["recompute_s"],
            views=len(self.views),
            estimated_keys=sources,
            too_big=self.too_big,
            thresholds=thresholds,
            predicted_working_peak=self.tally["working"],
        )


def _views(order: Any, task_of: Any, size: Mapping[str, int]) -> dict:
    """``{key: owner}`` for the keys of ``order`` whose result is a view or alias of an input
    (:func:`graph.memory.shared.shares_input`), the owner being the key that holds the bytes. A
    slice estimated at half its input or less is not one: Dask's ``getitem`` copies such a slice
    (so the large input can be let go)."""
    from .shared import owner_of, shares_input

    direct = {}
    for k in order:
        d = shares_input(task_of(k))
        if d is not None and d in size and 2 * size[k] > size[d]:
            direct[k] = d
    return {k: owner_of(k, direct) for k in direct}


def _uses(compiled: Any, sched: _Schedule) -> dict[str, list[int]]:
    """For each key of the order, the sorted positions of the tasks that read it (``len(order)``:
    gathered at the end)."""
    order = sched.order
    pos = {k: i for i, k in enumerate(order)}
    uses: dict[str, list[int]] = {k: [] for k in order}
    for k in order:
        task = compiled.graph.get(k) or compiled.metric_graph[k]
        for d in task.dependencies:
            uses[d].append(pos[k])
    for k in sched.held:
        uses[k].append(len(order))
    for u in uses.values():
        u.sort()
    return uses


#: a predicted peak this far from the measured one (either way) is reported
PEAK_TOLERANCE = 0.25


def compare_with_run(plan: MemoryPlan, measured: Mapping[str, Any]) -> dict[str, Any]:
    """Predicted against measured, and in words why they differ when they differ much.

    ``measured``: the run's ``peak_memory_bytes``, ``peak_worker_memory_bytes`` and
    ``spilled_bytes``.  Returns ``peak_prediction_ratio`` (measured / predicted peak) and,
    when the measured peak is more than 25% off or Dask spilled what the plan did not plan
    to spill, ``memory_plan_note``: one paragraph for people.

    >>> M = 2**20
    >>> p = MemoryPlan(budget=1000 * M, workers=2, baseline=100 * M, worker_data_budget=250 * M, order=(),
    ...                decisions={}, predicted_data_peak=150 * M, spill_bytes=0, read_bytes=0, recomputed=0)
    >>> out = compare_with_run(p, {"peak_memory_bytes": 700 * M, "peak_worker_memory_bytes": 380 * M,
    ...                            "spilled_bytes": 300 * M})
    >>> round(out["peak_prediction_ratio"], 2)
    1.4
    >>> print(out["memory_plan_note"])                                  # doctest: +ELLIPSIS
    measured peak 700.00 MiB is 40% above the predicted 500.00 MiB; Dask spilled 300.00 MiB that the plan ...
    """
    out: dict[str, Any] = {}
    peak = measured.get("peak_memory_bytes") or 0
    worker_peak = measured.get("peak_worker_memory_bytes") or 0
    spilled = measured.get("spilled_bytes") or 0
    predicted = plan.predicted_peak
    if not predicted or not peak:
        return out
    ratio = peak / predicted
    out["peak_prediction_ratio"] = ratio
    notes = []
    if abs(ratio - 1) > PEAK_TOLERANCE:
        notes.append(
            f"measured peak {format_bytes(peak)} is {abs(ratio - 1):.0%} {'above' if ratio > 1 else 'below'} "
            f"the predicted {format_bytes(predicted)}"
        )
    unplanned = spilled - plan.spill_bytes
    if unplanned > max(0.05 * spilled, 1 << 20):
        notes.append(f"Dask spilled {format_bytes(unplanned)} that the plan did not plan to spill "
                     f"({format_bytes(plan.spill_bytes)} planned): " + _why_spilled(plan, worker_peak))
    if notes and (ratio > 1 + PEAK_TOLERANCE or unplanned > max(0.05 * spilled, 1 << 20)):
        notes.append(
            "the difference is memory the plan does not model: temporaries of steps before their first "
            "instances were measured (stats['working_memory']), libraries a step loads that were not "
            "imported when idle memory was measured, and memory freed but not yet returned to the OS. "
            "Give each step more room (a larger memory_budget or fewer workers)"
        )
    elif notes:
        notes.append(
            "the plan models every worker as holding up to its own share at the same moment; Dask placed "
            "results more unevenly or released them sooner"
        )
    if notes:
        out["memory_plan_note"] = "; ".join(notes[:-1]) + ". " + notes[-1][0].upper() + notes[-1][1:] + "."
    return out


def why_text(plan: MemoryPlan, stats: Mapping[str, Any]) -> str:
    """Why a budgeted run wrote to disk or computed again, in one paragraph: what the plan planned
    (spills, recomputations with their measured seconds, views counted once) against what Dask
    did (bytes written past the plan's target for results, bytes its memory monitor wrote because
    a worker's process memory passed the spill threshold, tasks computed again).

    >>> M = 2**20
    >>> p = MemoryPlan(budget=1280 * M, workers=2, baseline=200 * M, worker_data_budget=248 * M, order=(),
    ...                decisions={}, predicted_data_peak=200 * M, spill_bytes=0, read_bytes=0, recomputed=0, views=90)
    >>> print(why_text(p, {"spilled_bytes": 30 * M, "monitor_spilled_bytes": 30 * M, "recomputed_tasks": 0,
    ...                    "recompute_seconds": 0.0, "second_pass_copies": 40}))     # doctest: +NORMALIZE_WHITESPACE
    planned: nothing to disk, nothing recomputed; 90 views or aliases counted once. Dask wrote 30.00 MiB:
    0 B past the plan's target for results, 30.00 MiB by its memory monitor (a worker's process memory
    past the spill threshold: not planned). Computed again: 40 second-pass copies, 0 tasks run twice (0.0 s).
    """
    planned = []
    if plan.spill_bytes:
        planned.append(f"{plan.count(SPILL)} results to disk ({format_bytes(plan.spill_bytes)} written, "
                       f"{format_bytes(plan.read_bytes)} read back)")
    if plan.count(RECOMPUTE):
        planned.append(f"{plan.count(RECOMPUTE)} results dropped and recomputed ({plan.recompute_seconds:.1f} s of "
                       "measured compute, less than writing and reading them)")
    text = "planned: " + ("; ".join(planned) if planned else "nothing to disk, nothing recomputed")
    if plan.views:
        text += f"; {plan.views} views or aliases counted once"
    spilled = int(stats.get("spilled_bytes") or 0)
    monitor = int(stats.get("monitor_spilled_bytes") or 0)
    text += (f". Dask wrote {format_bytes(spilled)}: {format_bytes(max(spilled - monitor, 0))} past the plan's target "
             f"for results, {format_bytes(monitor)} by its memory monitor (a worker's process memory past the spill "
             "threshold: not planned)")
    text += (f". Computed again: {int(stats.get('second_pass_copies') or 0)} second-pass copies, "
             f"{int(stats.get('recomputed_tasks') or 0)} tasks run twice ({float(stats.get('recompute_seconds') or 0.0):.1f} s).")
    return text


def _why_spilled(plan: MemoryPlan, worker_peak: int) -> str:
    """Which of Dask's two spill triggers the measured worker peak points to, with the numbers.

    Dask writes results to disk when a worker's *process* memory passes the ``spill`` threshold
    (then down to ``target``), and also when the results it holds (``dask.sizeof``) pass its
    spill buffer's target, which a plan that evicts sets to the plan's share for results.

    >>> M = 2**20
    >>> p = MemoryPlan(budget=1280 * M, workers=2, baseline=270 * M, worker_data_budget=178 * M, order=(),
    ...                decisions={}, predicted_data_peak=170 * M, spill_bytes=0, read_bytes=0, recomputed=0)
    >>> _why_spilled(p, 354 * M)                                        # doctest: +ELLIPSIS
    "no worker's process memory reached Dask's spill threshold (70% of 640.00 MiB = 448.00 MiB; the highest was 354.00 MiB), so Dask wrote these because the results a worker held (by dask.sizeof) passed ..."
    """
    limit = plan.worker_memory_limit
    frac = plan.thresholds.results_fraction
    at = int(limit * frac)
    if worker_peak > at:
        return (
            f"a worker's process memory reached {format_bytes(worker_peak)}, past Dask's spill threshold "
            f"({frac:.0%} of {format_bytes(limit)} = {format_bytes(at)}), where Dask writes results to disk "
            f"until the process is back under its target; the plan expected at most {format_bytes(plan.baseline + plan.predicted_data_peak)} "
            f"(idle {format_bytes(plan.baseline)} + results {format_bytes(plan.predicted_data_peak)})"
        )
    return (
        f"no worker's process memory reached Dask's spill threshold ({frac:.0%} of {format_bytes(limit)} = "
        f"{format_bytes(at)}; the highest was {format_bytes(worker_peak)}), so Dask wrote these because the results "
        f"a worker held (by dask.sizeof) passed its spill buffer's target ({format_bytes(plan.worker_data_budget)}, "
        "the plan's share for results, where the plan evicts; Dask's own target otherwise): results held longer or "
        "larger than the plan's sizes and order assumed"
    )
