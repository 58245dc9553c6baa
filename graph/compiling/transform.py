"""The graph transform a run applies before it executes: load what the result store holds,
save what it computes, and guard the steps that must not run twice.

- a key already in the store becomes a *load task* with no dependencies, and branches need
  only the tasks their stored results do not cover (nothing upstream of a stored result is
  loaded or run);
- every other step (and choose-metric) task is wrapped so that the worker that computes it
  writes the result (:class:`graph.tasks.store.SaveResult`); failing steps store nothing;
- a step a pruning rule's ``max_iter`` may cut short, and every task computed from it, neither
  loads nor saves (:func:`capped_keys`): at the cap the step's value is its last report, under
  the same key as a run without the cap, so the two must not share what the store holds;
- a step marked ``not_rerunnable`` is wrapped in :class:`graph.tasks.rerun.RunOnce`.

:func:`prepare` returns a :class:`PreparedRun`: the pipeline to execute (a plain
``CompiledPipeline``) and, as explicit fields, the original pipeline's task counts and
the keys loaded, saved and guarded.

>>> import tempfile
>>> from pipelines import Pipeline, grid
>>> def load(): return 1
>>> def add(x, n): return x + n
>>> c = Pipeline("doc").source(load).explore("n", grid(add, n=[1, 2])).compile()
>>> d = tempfile.mkdtemp()
>>> len(prepare(c, store=d).saving)          # nothing stored yet: every task will save
3
>>> from graph.tasks.store import ResultStore
>>> ResultStore(d).save(c.branches[0].key, 2)
True
>>> run = prepare(c, store=d)
>>> run.loaded == {c.branches[0].key}, run.compiled.branches[0].lineage == (c.branches[0].key,)
(True, True)
>>> run.naive_tasks == c.naive_tasks, run.compiled.naive_tasks < c.naive_tasks
(True, True)
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from dask.task_spec import Task

from ..parcels import opened
from ..state.halving import Pruned
from ..tasks.iterative import Iterative
from ..tasks.rerun import RunOnce, is_rerun_safe, once_name
from ..tasks.store import ResultStore, load_stored, write_result
from .compiler import Branch, ChoosePoint, CompiledPipeline, dependents_of

__all__ = ["PreparedRun", "SaveResult", "capped_keys", "prepare"]


class SaveResult:
    """Runs a step on the worker and writes its result to the store."""

    def __init__(self, fn: Any, path: str, key: str):
        self.fn, self.path, self.key = fn, path, key
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        made = self.fn(*args, **kwargs)  # a plain step's parcel (graph.parcels) travels on as it is
        value = opened(made)
        # a pruned step stores nothing (it reruns next time), nor does a read of its value
        # (a metric task that ran before the run's cancel reached the scheduler)
        if not isinstance(value, Pruned) and not any(isinstance(a, Pruned) for a in (*args, *kwargs.values())):
            write_result(self.path, self.key, value)
        return made


@dataclasses.dataclass
class PreparedRun:
    """What :func:`prepare` made of a pipeline: the one to execute, the original's task
    counts (what the user's pipeline has, whatever the store spares), the keys loaded
    from the store, the keys that will save, and the once-only keys (cleared by :meth:`forget`)."""

    compiled: CompiledPipeline
    naive_tasks: int
    unique_tasks: int
    store: ResultStore | None = None
    loaded: frozenset = frozenset()
    saving: frozenset = frozenset()
    once: tuple = ()
    run_id: str = ""

    def forget(self, client: Any) -> None:
        """Clear the run's once-only markers from the scheduler (on every path a run ends by)."""
        if self.once:
            from distributed import Event

            for key in self.once:
                Event(once_name(self.run_id, key), client=client).clear()

    def finish(self, executed: dict[str, int]) -> dict[str, Any]:
        """The stats entries to add or correct after the run."""
        if self.store is None:
            return {}
        step_keys = self.compiled.graph
        loaded = sum(n for k, n in executed.items() if k in self.loaded)
        saved = sum(1 for k in self.saving if executed.get(k) and k in self.store)
        return {
            "executed_tasks": sum(n for k, n in executed.items() if k in step_keys and k not in self.loaded),
            "metric_tasks": sum(n for k, n in executed.items() if k in self.compiled.metric_graph and k not in self.loaded),
            "loaded_from_store": loaded,
            "saved_to_store": saved,
            "store": self.store.path,
        }


def capped_keys(*graphs: dict[str, Task]) -> frozenset[str]:
    """The keys of ``graphs`` whose value a pruning rule's ``max_iter`` may cut short: the
    iterative steps under such a rule (at the cap they return their last report, not their own
    value) and every task that reads one, directly or not.

    >>> from dask.task_spec import Task, TaskRef
    >>> from graph.tasks.iterative import Iterative
    >>> from graph.spec import PruneSpec
    >>> def fit(x):
    ...     yield {"a": x}
    >>> def read(v): return v
    >>> g = {"x": Task("x", read, 1), "fit": Task("fit", Iterative(fit, PruneSpec(2, 1, 4)), TaskRef("x")),
    ...      "m": Task("m", read, TaskRef("fit"))}
    >>> sorted(capped_keys(g)), capped_keys({**g, "fit": Task("fit", Iterative(fit, PruneSpec(2, 1)), TaskRef("x"))})
    (['fit', 'm'], frozenset())
    """
    tasks = {k: t for g in graphs for k, t in g.items() if isinstance(t, Task)}
    todo = [k for k, t in tasks.items() if isinstance(t.func, Iterative) and t.func.prune is not None
            and t.func.prune.max_iter is not None]
    if not todo:
        return frozenset()
    readers = dependents_of(tasks)
    seen = set(todo)
    while todo:
        for r in readers.get(todo.pop(), ()):
            if r not in seen:
                seen.add(r)
                todo.append(r)
    return frozenset(seen)


def _transform(
    graph: dict[str, Task], store: ResultStore | None, run_id: str, loaded: set, saving: set, once: list,
    unstored: frozenset = frozenset(),
) -> dict[str, Task]:
    out: dict[str, Task] = {}
    for key, task in graph.items():
        if not isinstance(task, Task):  # a Dask collection's data or alias node: nothing to store or guard
            out[key] = task
            continue
        if store is not None and key in store and key not in unstored:
            out[key] = Task(key, load_stored, store.file(key), key)
            loaded.add(key)
            continue
        fn = task.func
        if not is_rerun_safe(fn):
            fn = RunOnce(fn, key, run_id)
            once.append(key)
        if store is not None and key not in unstored:
            fn = SaveResult(fn, store.file(key), key)
            saving.add(key)
        out[key] = task if fn is task.func else Task(key, fn, *task.args, **task.kwargs)
    return out


def prepare(compiled: CompiledPipeline, store: Any = None, run_id: str = "") -> PreparedRun:
    """Apply the store and once-only transforms; with neither, ``compiled`` runs untouched."""
    store = None if store is None else ResultStore(store)
    run_id = run_id or uuid.uuid4().hex[:12]
    naive, unique = compiled.naive_tasks, compiled.unique_tasks
    needs_guard = any(not is_rerun_safe(getattr(t, "func", None)) for t in compiled.graph.values())
    if store is None and not needs_guard:
        return PreparedRun(compiled, naive, unique, run_id=run_id)
    loaded: set[str] = set()
    saving: set[str] = set()
    once: list[str] = []
    unstored = capped_keys(compiled.graph, compiled.metric_graph) if store is not None else frozenset()
    graph = _transform(compiled.graph, store, run_id, loaded, saving, once, unstored)
    metric_graph = _transform(compiled.metric_graph, store, run_id, loaded, saving, once, unstored)
    new = dataclasses.replace(compiled, graph=graph, metric_graph=metric_graph)
    if loaded:
        new = _prune(new)
    return PreparedRun(new, naive, unique, store, frozenset(loaded), frozenset(saving), tuple(once), run_id)


def _prune(new: CompiledPipeline) -> CompiledPipeline:
    """Restrict each branch's lineage to the tasks its target really needs (loads cut it short)."""
    graph, metric_graph = new.graph, new.metric_graph
    memo: dict[str, frozenset] = {}

    def closure(key: str) -> frozenset:
        stack = [key]
        while stack:  # iterative post-order: deep pipelines must not hit the recursion limit
            k = stack.pop()
            if k in memo:
                continue
            deps = (graph.get(k) or metric_graph[k]).dependencies
            missing = [d for d in deps if d not in memo]
            if missing:
                stack.append(k)
                stack.extend(missing)
                continue
            memo[k] = frozenset({k}).union(*(memo[d] for d in deps))
        return memo[key]

    def pruned(b: Branch, target: str) -> Branch:
        need = closure(target)
        return dataclasses.replace(b, lineage=tuple(k for k in b.lineage if k in need))

    return dataclasses.replace(
        new,
        branches=[pruned(b, b.key) for b in new.branches],
        chooses=[
            ChoosePoint(cp.index, cp.spec, [pruned(b, mk) for b, mk in zip(cp.inputs, cp.metric_keys)], cp.metric_keys)
            for cp in new.chooses
        ],
        dependents=dependents_of(graph),
    )
