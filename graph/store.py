"""Graph transforms the executor applies before a run: a persistent result store, and
steps that must not be rerun after a worker loss.

**Result store** (opt-in, ``node.run(store="results/")`` or ``quiver run FILE --store DIR``):
a directory with one file per task key.  Keys are deterministic tokens of (function
identity *including a digest of its code*, parameters, input keys), see ``graph.keys``,
so a file is valid for exactly the work that made it:

- a key already in the store becomes a *load task* with no dependencies, and branches
  need only the tasks their stored results do not cover (nothing upstream of a stored
  result is loaded or run);
- every other step (and choose-metric) task is wrapped so that the worker that computes
  it writes the result (cloudpickle, a temporary file then ``os.replace``: readers never
  see half a file; two workers writing the same key write the same bytes);
- values that cannot be pickled are not stored (a ``StoreWarning`` on the worker), and
  failing steps store nothing, so they run again next time;
- editing a step's code changes its key and every key downstream of it, so their old
  entries are simply never read again (delete the directory to reclaim the space).

The directory must be visible at the same path to the client and every worker: any
local directory for one host (several worker processes are fine), a shared filesystem
(NFS, Lustre, ...) across hosts.

**Not rerunnable steps**: Dask recomputes the keys a dead worker held, so steps must be
idempotent.  A step decorated with :func:`not_rerunnable` fails its branch with a
:class:`RerunRefused` error instead of running a second time in the same run.

>>> import tempfile
>>> store = ResultStore(tempfile.mkdtemp())
>>> store.save("add-1234", {"x": 1})
True
>>> "add-1234" in store, store.load("add-1234")
(True, {'x': 1})
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle
from dask.task_spec import Task

from .compiler import Branch, ChoosePoint, CompiledPipeline

__all__ = [
    "ResultStore",
    "StoreError",
    "StoreWarning",
    "RerunRefused",
    "not_rerunnable",
    "is_rerun_safe",
    "RunPlan",
    "prepare",
]


class StoreError(RuntimeError):
    """A stored result could not be read back."""


class StoreWarning(UserWarning):
    """A result could not be stored (it is still used by the run)."""


class RerunRefused(RuntimeError):
    """A step marked :func:`not_rerunnable` was about to run a second time after a worker loss."""


# ---- the directory ------------------------------------------------------------------------------


class ResultStore:
    """A directory holding one pickled result per task key.

    >>> import tempfile
    >>> s = ResultStore(tempfile.mkdtemp())
    >>> s.file("fit<x>-ab12").endswith("fit_x_-ab12.pkl")
    True
    >>> len(s)
    0
    """

    SUFFIX = ".pkl"

    def __init__(self, path: str | os.PathLike):
        if isinstance(path, ResultStore):
            path = path.path
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"store must be a directory path, got {type(path).__name__} {path!r}")
        self.path = os.path.abspath(os.fspath(path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"store {self.path!r} exists and is not a directory")
        os.makedirs(self.path, exist_ok=True)

    def __repr__(self) -> str:
        return f"ResultStore({self.path!r})"

    def file(self, key: str) -> str:
        """The file that holds ``key``'s result."""
        return os.path.join(self.path, re.sub(r"[^A-Za-z0-9_.-]", "_", str(key)) + self.SUFFIX)

    def __contains__(self, key: str) -> bool:
        return os.path.isfile(self.file(key))

    def __len__(self) -> int:
        return sum(1 for n in os.listdir(self.path) if n.endswith(self.SUFFIX))

    def load(self, key: str) -> Any:
        return _load_stored(self.file(key), key)

    def save(self, key: str, value: Any) -> bool:
        """Store ``value`` under ``key``; ``False`` (with a warning) if it cannot be pickled or written."""
        return _write(self.file(key), key, value)


def _load_stored(path: str, key: str) -> Any:
    try:
        with open(path, "rb") as f:
            return cloudpickle.load(f)
    except Exception as exc:
        raise StoreError(
            f"result store: cannot load {key!r} from {path} ({type(exc).__name__}: {exc}). "
            "Delete that file (or the store directory) and run again to recompute it."
        ) from exc


def _write(path: str, key: str, value: Any) -> bool:
    try:
        blob = cloudpickle.dumps(value, protocol=5)
    except Exception as exc:
        warnings.warn(
            f"result store: not saving {key!r}: its value ({type(value).__name__}) cannot be pickled "
            f"({type(exc).__name__}: {exc}); it will be recomputed next time",
            StoreWarning,
            stacklevel=2,
        )
        return False
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the old file, the new one, or none
        return True
    except OSError as exc:
        warnings.warn(f"result store: could not write {key!r} to {path}: {exc}", StoreWarning, stacklevel=2)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


class _SaveResult:
    """Runs a step on the worker and writes its result to the store."""

    def __init__(self, fn: Callable, path: str, key: str):
        self.fn, self.path, self.key = fn, path, key
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = self.fn(*args, **kwargs)
        _write(self.path, self.key, value)
        return value


# ---- steps that must not run twice ----------------------------------------------------------------


def not_rerunnable(fn: Callable) -> Callable:
    """Mark a step function as unsafe to run twice (it sends mail, appends to a file, ...).

    Dask recomputes a task whose worker died.  A step marked here instead fails its
    branch with :class:`RerunRefused` (other branches are unaffected), so its side effect
    happens at most once per run.  The marker is a function attribute; the function is
    returned unchanged.

    >>> @not_rerunnable
    ... def send_report(result):
    ...     return result
    >>> is_rerun_safe(send_report), is_rerun_safe(len)
    (False, True)
    """
    try:
        fn.__quiver_rerun_safe__ = False
    except (AttributeError, TypeError):
        raise TypeError(
            f"not_rerunnable: cannot mark {fn!r}; decorate a plain Python function"
        ) from None
    return fn


def is_rerun_safe(fn: Callable) -> bool:
    """``False`` for a step marked :func:`not_rerunnable` (also through ``ByValue``/store wrappers)."""
    for _ in range(16):
        if getattr(fn, "__quiver_rerun_safe__", True) is False:
            return False
        inner = getattr(fn, "fn", None) or getattr(fn, "func", None)
        if inner is None or inner is fn:
            return True
        fn = inner
    return True


def _once_name(run_id: str, key: str) -> str:
    return f"quiver-once-{run_id}-{key}"


class _RunOnce:
    """Refuses to start a step a second time in one run (a cluster-wide ``distributed.Event``)."""

    def __init__(self, fn: Callable, key: str, run_id: str):
        self.fn, self.key, self.run_id = fn, key, run_id
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from distributed import Event

        started = Event(_once_name(self.run_id, self.key))
        if started.is_set():
            raise RerunRefused(
                f"step {self.key.rsplit('-', 1)[0]!r} (key {self.key!r}) already started once in this "
                "run and its worker was lost; it is marked not_rerunnable, so its branch fails "
                "instead of running it again. Make the step idempotent, or rerun the exploration."
            )
        started.set()
        return self.fn(*args, **kwargs)


# ---- the transform ---------------------------------------------------------------------------------


@dataclasses.dataclass
class _Figures(CompiledPipeline):
    """A transformed pipeline that still reports the original pipeline's task counts
    (fields, so ``dataclasses.replace`` by a later transform keeps them)."""

    original_naive: int = 0
    original_unique: int = 0
    loaded: frozenset = frozenset()  # keys whose results come from the store

    @property
    def naive_tasks(self) -> int:
        return self.original_naive

    @property
    def unique_tasks(self) -> int:
        return self.original_unique


@dataclasses.dataclass
class RunPlan:
    """What :func:`prepare` did: the pipeline to execute, the keys loaded from the store,
    the keys that will save, and the once-only keys (cleared by :meth:`finish`)."""

    compiled: CompiledPipeline
    store: ResultStore | None = None
    loaded: frozenset = frozenset()
    saving: frozenset = frozenset()
    once: tuple = ()
    run_id: str = ""

    def finish(self, client: Any, executed: dict[str, int]) -> dict[str, Any]:
        """Clean up after the run; return the stats entries to add or correct."""
        if self.once:
            from distributed import Event

            for key in self.once:
                try:
                    Event(_once_name(self.run_id, key), client=client).clear()
                except Exception:  # the scheduler may be gone
                    pass
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


def _transform(
    graph: dict[str, Task], store: ResultStore | None, run_id: str, loaded: set, saving: set, once: list, clones: dict
) -> dict[str, Task]:
    out: dict[str, Task] = {}
    for key, task in graph.items():
        skey = clones.get(key, key)
        if store is not None and skey in store:
            out[key] = Task(key, _load_stored, store.file(skey), skey)
            loaded.add(key)
            continue
        fn = task.func
        if not is_rerun_safe(fn):
            fn = _RunOnce(fn, key, run_id)
            once.append(key)
        if store is not None and skey == key:
            fn = _SaveResult(fn, store.file(key), key)
            saving.add(key)
        out[key] = task if fn is task.func else Task(key, fn, *task.args, **task.kwargs)
    return out


def prepare(compiled: CompiledPipeline, store: Any = None, run_id: str = "") -> RunPlan:
    """Apply the store and once-only transforms; with neither, return ``compiled`` untouched.

    >>> import tempfile
    >>> from pipelines import Pipeline, grid
    >>> def load(): return 1
    >>> def add(x, n): return x + n
    >>> c = Pipeline("doc").source(load).explore("n", grid(add, n=[1, 2])).compile()
    >>> d = tempfile.mkdtemp()
    >>> len(prepare(c, store=d).saving)          # nothing stored yet: every task will save
    3
    >>> ResultStore(d).save(c.branches[0].key, 2)
    True
    >>> plan = prepare(c, store=d)
    >>> plan.loaded == {c.branches[0].key}, plan.compiled.branches[0].lineage == (c.branches[0].key,)
    (True, True)
    """
    store = None if store is None else ResultStore(store)
    run_id = run_id or uuid.uuid4().hex[:12]
    needs_guard = any(not is_rerun_safe(t.func) for t in compiled.graph.values())
    if store is None and not needs_guard:
        return RunPlan(compiled, run_id=run_id)
    loaded: set[str] = set()
    saving: set[str] = set()
    once: list[str] = []
    clones = getattr(compiled, "clones", None) or {}  # a memory plan's recompute copies share a file
    graph = _transform(compiled.graph, store, run_id, loaded, saving, once, clones)
    metric_graph = _transform(compiled.metric_graph, store, run_id, loaded, saving, once, clones)
    fields = {f.name: getattr(compiled, f.name) for f in dataclasses.fields(compiled)}
    fields.update(
        graph=graph,
        metric_graph=metric_graph,
        original_naive=compiled.naive_tasks,
        original_unique=compiled.unique_tasks,
        loaded=frozenset(loaded),
    )
    new = _Figures(**fields)
    if loaded:
        _prune(new, graph, metric_graph)
    return RunPlan(new, store, frozenset(loaded), frozenset(saving), tuple(once), run_id)


def _prune(new: CompiledPipeline, graph: dict[str, Task], metric_graph: dict[str, Task]) -> None:
    """Restrict each branch's lineage to the tasks its target really needs (loads cut it short)."""
    memo: dict[str, frozenset] = {}

    def closure(key: str) -> frozenset:
        stack, order = [key], []
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

    new.branches = [pruned(b, b.key) for b in new.branches]
    new.chooses = [
        ChoosePoint(cp.index, cp.spec, [pruned(b, mk) for b, mk in zip(cp.inputs, cp.metric_keys)], cp.metric_keys)
        for cp in new.chooses
    ]
    dependents: dict[str, set[str]] = {k: set() for k in graph}
    for key, task in graph.items():
        for dep in task.dependencies:
            dependents[dep].add(key)
    new.dependents = dependents
