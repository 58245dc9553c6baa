"""Ready tasks where they start first: a task whose inputs sit on a busy worker may start on another.

Why: Dask places a ready task only on a worker that holds its inputs
(``distributed.scheduler.decide_worker`` looks at no other worker), so the alternatives that
read one result (the feature sets of one scaling, the models of one feature set) all queue on
the worker that computed it, and only work stealing moves some away. Stealing needs that
worker's answer, from its event loop, and a step that holds the GIL keeps the loop silent until
it ends: scipy's full SVD (a PCA with ``svd_solver="full"``) held it for 0.8 s, so on a 2-worker
cluster three of four 0.9 s polynomial+PCA prefixes ran one after the other on one worker while
the other waited (``benchmarks/common_cases.py``'s digits workload: Dask's task stream and its
``stealing`` events, docs/guide/speed.md). Deciding *when a task becomes ready* needs no answer:
nothing has been sent yet. Dealing siblings over the workers when they are submitted was tried
first and dropped: on the 112-branch grid a worker then waited for inputs still being computed
on the other one, 1.6 s of gaps per worker instead of 0.1-0.8 s.

The rule is :func:`place_ready` (pure): each task that just became ready, in priority order, goes
where it can start first, counting the work each worker has queued (Dask's occupancy, per
thread) and the time to move its inputs there (Dask's own estimate: the bytes over the cluster's
bandwidth); a worker holding its inputs wins a tie, and then Dask places the task itself. It is
Dask's own objective (``Scheduler.worker_objective``) over every worker instead of only the
holders, taken when nothing has been sent yet.

The thin part: :class:`SpreadReady`, a ``SchedulerPlugin`` that the run (``pipelines/runner.py``)
installs with :func:`install` before it submits anything and removes with :func:`remove` when it
ends. When one of the run's results comes into memory, Dask has already marked the readers it made
ready and not yet placed them (a plugin's ``transition`` runs first), and when a submission's tasks
read only results in memory (a stage after a choose), Dask has not yet made them ready (a plugin's
``update_graph`` runs first); the plugin gives each task the
rule sends elsewhere a *loose* restriction to that worker (Dask places it there, runs it elsewhere if
that worker leaves, and may still steal it). Not placed: training steps (their shared inputs are
copied by ``graph.run.sharedcopies`` and packed tasks placed by ``graph.compiling.packing.place_packs``);
nothing while a new cluster's bridge is in (``graph.cluster.bridge``: a step holding the GIL in the
user's process holds up every transfer from it, and the bridge's hand-over decides); not
installed for runs under a memory budget (its plan counts one copy of each result) or of Dask
collections (Dask places partitions). Dask config ``quiver.spread-ready: False`` turns it off.

>>> place_ready([("fit-1", {"a"}, 1.0), ("fit-2", {"a"}, 1.0), ("fit-3", {"a"}, 1.0)],
...             workers={"a": (0.0, 1), "b": (0.0, 1)})
{'fit-2': 'b'}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._dask import prefix_duration
from ..config import config_flag
from . import runplugins
from .runplugins import RunPlugin

__all__ = ["SpreadReady", "enabled", "install", "install_readers", "place_ready", "remove", "spread_keys"]

_CONFIG = "quiver.spread-ready"


def place_ready(ready: Sequence[tuple[str, Iterable[str], float]], workers: Mapping[str, tuple[float, int]],
                move_cost: Callable[[str, str], float] | None = None) -> dict[str, str]:
    """``{task: worker}`` for the ``ready`` tasks that should start on a worker not holding their
    inputs. ``ready``: ``(task, the workers holding its inputs, its expected seconds)`` in priority
    order; ``workers``: ``{worker: (seconds of work it has, threads)}``; ``move_cost(task,
    worker)``: seconds to bring the task's inputs there (default 0). Each task goes where it can
    start first (its worker's work per thread, plus the move), a holder on a tie (where Dask sends
    it itself, unplaced); that worker's work then grows by the task's seconds.

    >>> place_ready([("m1", {"a"}, 1.0), ("m2", {"a"}, 1.0), ("m3", {"a"}, 1.0)], {"a": (0.0, 1), "b": (0.0, 1)})
    {'m2': 'b'}
    >>> place_ready([("m1", {"a"}, 1.0), ("m2", {"a"}, 1.0)], {"a": (0.0, 1), "b": (0.5, 1)},
    ...             move_cost=lambda task, worker: 2.0)
    {}
    >>> place_ready([("m1", {"a", "b"}, 1.0), ("m2", {"a", "b"}, 1.0)], {"a": (0.0, 1), "b": (0.0, 1)})
    {}
    """
    load = {w: float(work) for w, (work, _) in workers.items()}
    threads = {w: max(1, int(n)) for w, (_, n) in workers.items()}
    placed: dict[str, str] = {}
    if not load:
        return placed
    for task, holders, seconds in ready:
        holders = set(holders)

        def start(w: str) -> tuple:
            moving = 0.0 if w in holders or move_cost is None else move_cost(task, w)
            return (load[w] / threads[w] + moving, w not in holders, w)

        best = min(load, key=start)
        if best not in holders:
            placed[task] = best
        load[best] += max(0.0, float(seconds))
    return placed


def enabled() -> bool:
    """Whether runs send ready tasks to idle workers (dask config ``quiver.spread-ready``, default
    True); a value that is not a boolean is an error that says how to set it.

    >>> enabled()
    True
    """
    return config_flag(_CONFIG, "a ready task whose inputs' worker is busy may start on another")


def spread_keys(compiled: Any) -> set[str]:
    """The compiled run's tasks the plugin may place: every step task but training steps
    (:func:`graph.state.machine.runs_iterative`) and packed tasks (placed already)."""
    from ..state.machine import runs_iterative

    graph = getattr(compiled, "graph", {})
    packed = set(getattr(compiled, "packed", None) or ()) | set(getattr(compiled, "placement", None) or ())
    return {k for k, t in graph.items() if k not in packed and not runs_iterative(t)}


class SpreadReady(RunPlugin):
    """On the scheduler: when one of ``keys``' inputs comes into memory, the readers it made ready
    that :func:`place_ready` sends elsewhere get a loose restriction to that worker. ``inputs``:
    results whose readers are placed so whatever their keys (a run that submits its tasks as it
    goes, an adaptive search, names the inputs its tasks will read instead). ``placed`` counts
    them; :func:`remove` returns it."""

    def __init__(self, name: str, keys: Iterable[str], inputs: Iterable[str] = ()):
        super().__init__(name)
        self.keys = frozenset(keys)
        self.inputs = frozenset(inputs)
        self.placed = 0

    def outcome(self) -> int:
        return self.placed

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        # called for every transition of every task: return at once unless a result just came
        # into memory whose readers include this run's tasks (Dask marked them ready, not placed)
        if finish != "memory" or self._scheduler is None:
            return
        ts = self._scheduler.tasks.get(key)
        if ts is None or len(ts.dependents) < 2:
            return
        every = key in self.inputs
        self._place([d for d in ts.dependents
                     if (every or d.key in self.keys) and d.state == "waiting" and not d.waiting_on])

    def update_graph(self, scheduler, *args, tasks=None, **kwargs: Any) -> None:
        # a submission whose tasks read only results in memory (a stage after a choose): called
        # before Dask makes them ready and places them
        if self._scheduler is None:
            self._scheduler = scheduler
        found = [t for t in (scheduler.tasks.get(k) for k in (tasks or ())) if t is not None]
        ready = [t for t in found if t.state == "released" and t.dependencies
                 and all(d.state == "memory" for d in t.dependencies)]
        mine = [t for t in ready if t.key in self.keys]
        if mine:
            self._place(mine)
        elif self.inputs:  # one trial at a time: a single reader of a shared input is placed too
            self._place([t for t in ready if any(d.key in self.inputs for d in t.dependencies)], at_least=1)

    def _place(self, ready: list, at_least: int = 2) -> None:
        """Restrict the ``ready`` tasks that :func:`place_ready` sends away from their inputs
        (none when fewer than ``at_least`` of them are ready: a lone task is Dask's to place)."""
        ready = sorted((d for d in ready if not d.worker_restrictions), key=lambda d: d.priority)
        if len(ready) < at_least or not ready:
            return
        from distributed.core import Status

        from ..cluster.bridge import NAME as BRIDGE

        s = self._scheduler
        if any(ws.name == BRIDGE for ws in s.workers.values()):
            # the user's process works while the workers start, and a step holding the GIL there
            # holds up the scheduler and every transfer from it: Dask's placement and the bridge's
            # hand-over (graph/cluster/bridge.py) decide until it has gone (measured: 0.2 s slower first calls)
            return
        running = {ws.address: ws for ws in s.workers.values() if ws.status == Status.running}
        if len(running) < 2:
            return
        by_key = {d.key: d for d in ready}
        work = {addr: (ws.occupancy, ws.nthreads) for addr, ws in running.items()}
        tasks = [(d.key, {w.address for dep in d.dependencies for w in dep.who_has}, prefix_duration(s, d.prefix))
                 for d in ready]

        def move_cost(task: str, worker: str) -> float:  # Dask's own estimate (bytes over its bandwidth)
            return s.get_comm_cost(by_key[task], running[worker])

        for task, worker in place_ready(tasks, work, move_cost).items():
            dts = by_key[task]
            dts.worker_restrictions = {worker}
            dts.loose_restrictions = True
            self.placed += 1


def install(client: Any, compiled: Any, budgeted: bool = False, timeout: float = 10.0) -> str | None:
    """Register a :class:`SpreadReady` for ``compiled`` on ``client``'s scheduler; returns its
    name (``None``: turned off, a budgeted run or one of Dask collections, nothing to place, or the
    scheduler did not answer within ``timeout`` s: the run goes on with Dask's placement)."""
    if budgeted or not enabled() or getattr(compiled, "has_collections", False):
        return None
    keys = spread_keys(compiled)
    if len(keys) < 2:
        return None
    return runplugins.install(client, SpreadReady(runplugins.plugin_name("quiver-spread"), keys), timeout,
                              "the ready-task spread")


def install_readers(client: Any, inputs: Iterable[str], timeout: float = 10.0) -> str | None:
    """Register a :class:`SpreadReady` that places the readers of ``inputs`` (a run whose tasks
    are not known when it starts: an adaptive search, whose trials all read the same source);
    returns its name (``None``: turned off, no inputs, or the scheduler did not answer)."""
    inputs = frozenset(inputs)
    if not inputs or not enabled():
        return None
    return runplugins.install(client, SpreadReady(runplugins.plugin_name("quiver-spread"), (), inputs), timeout,
                              "the ready-task spread")


def remove(client: Any, name: str | None, timeout: float = 10.0) -> int:
    """Unregister the plugin ``name`` (waiting ``timeout`` s at most); returns how many tasks it
    placed (0 when nothing was installed or the scheduler did not say)."""
    return runplugins.remove(client, name, 0, timeout, "the ready-task spread")
