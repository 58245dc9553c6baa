"""Warm workers at once: every worker imports the modules a run's steps come from, all at
the same time, as the run starts.

Why: a fresh worker pays its imports (scikit-learn ~1.5 s, torch several seconds on two
cores) when its first task is unpickled.  An exploration starts narrow (a source, then a few
prefix steps), so the second worker's first task, and its imports, come only after the
first worker's; the imports sit on the run's critical path one worker after another.
Importing them on every worker at once, before the run's first task, makes the run wait for
the slowest worker's imports instead of the sum of the workers' imports one after another.
Nothing runs a user's step: only modules are imported.

The decision is pure (:func:`step_modules`: modules named by the compiled graph's functions),
the cluster part one bounded call (:func:`warm_workers`).

>>> import types
>>> from sklearn.svm import SVC
>>> def fit(data, C):
...     return SVC(C=C)
>>> class Task:
...     func = staticmethod(fit)
>>> step_modules(types.SimpleNamespace(graph={"k": Task()}))  # this docstring's own module, and SVC's
['graph.cluster.warmup', 'sklearn.svm._classes']
"""

from __future__ import annotations

import logging
import sys
import types
import weakref
from collections.abc import Iterable
from typing import Any

from ..wrappers import innermost

__all__ = ["imported_by_warmup", "step_modules", "warm_workers"]

logger = logging.getLogger(__name__)

_SKIP = {"__main__", "builtins", "__mp_main__"}


def _named(fn: Any) -> set[str]:
    """Modules ``fn`` comes from or names in its globals (one level)."""
    found = set()
    module = getattr(fn, "__module__", None)
    if isinstance(module, str):
        found.add(module)
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", None) or {}
    for name in (code.co_names if code is not None else ()):
        obj = glb.get(name)
        if isinstance(obj, types.ModuleType):
            found.add(obj.__name__)
        elif callable(obj):
            owner = getattr(innermost(obj), "__module__", None)
            if isinstance(owner, str):
                found.add(owner)
    return found


#: how deep :func:`_held` looks into the objects a step holds or is given (an estimator inside a
#: pipeline inside the drop-in's fold step is three levels), and the most items of a container
#: it opens (data is not walked: its modules come with the values' own unpickling)
_DEPTH = 4
_ITEMS = 64
#: the most objects looked at per task, whatever their nesting (a bound on the walk's cost)
_BUDGET = 500


def _held(value: Any, found: set[str], depth: int = _DEPTH, budget: list[int] | None = None) -> None:
    """Modules of the classes of the objects in ``value`` (a step object's attributes, a task's
    arguments: the drop-in's estimators travel there, not in a function's globals); at most
    ``budget[0]`` objects are looked at."""
    budget = [_BUDGET] if budget is None else budget
    if depth < 0 or budget[0] <= 0 or value is None or isinstance(value, (str, bytes, int, float, bool)):
        return
    budget[0] -= 1
    if isinstance(value, (list, tuple, set, frozenset)):
        if len(value) <= _ITEMS:
            for item in value:
                _held(item, found, depth - 1, budget)
        return
    if isinstance(value, dict):
        if len(value) <= _ITEMS:
            for item in value.values():
                _held(item, found, depth - 1, budget)
        return
    kind = value if isinstance(value, type) else type(value)
    module = getattr(kind, "__module__", None)
    if isinstance(module, str) and module != "builtins":
        found.add(module)
    if isinstance(value, type) or callable(getattr(value, "__array__", None)):
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        _held(attrs, found, depth - 1, budget)
    slots = [n for k in kind.__mro__ for n in getattr(k, "__slots__", ()) if isinstance(n, str)]
    if slots:  # dask.task_spec's nodes (a literal argument's DataNode) keep their values in slots
        _held([getattr(value, n, None) for n in slots[:_ITEMS]], found, depth - 1, budget)


def step_modules(compiled: Any) -> list[str]:
    """The importable modules a compiled run's step functions come from or name, and those of
    the objects the steps hold or are given (sorted; ``__main__`` excluded: its functions travel
    by value)."""
    found: set[str] = set()
    tasks: Iterable = list(getattr(compiled, "graph", {}).values()) + list(getattr(compiled, "metric_graph", {}).values())
    for task in tasks:
        fn = innermost(getattr(task, "func", None))
        budget = [_BUDGET]
        if fn is not None:
            found |= _named(fn)
            _held(fn, found, budget=budget)
        _held(list(getattr(task, "args", ()) or ()), found, budget=budget)
        _held(dict(getattr(task, "kwargs", {}) or {}), found, budget=budget)
    return sorted(m for m in found if m not in _SKIP and not m.startswith(("<", "dask.", "distributed.")))


#: per worker process: modules the warm-up imported, and those it could not (name -> error)
imported_by_warmup: dict[str, str | None] = {}


def _import_all(modules: list[str]) -> None:
    import importlib

    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            imported_by_warmup[name] = None
        except Exception as exc:  # recorded: a module only a step's own process can import is the step's business
            imported_by_warmup[name] = f"{type(exc).__name__}: {exc}"


def warm_workers(client: Any, modules: list[str], timeout: float = 60.0) -> None:
    """Have every worker of ``client`` import ``modules`` now, all workers at once, before the
    run submits anything; waits at most ``timeout`` seconds (then the run goes on, each
    worker importing what it still lacks when its tasks arrive).

    The imports run on each worker's event loop while nothing else runs there, never beside a
    task or a task's unpickling: a warm-up that imported in a worker thread while the event loop
    unpickled the run's first collection tasks (pandas/pyarrow/dask.dataframe) deadlocked the
    worker. ``dask config quiver.warmup: False`` turns it off."""
    import dask

    if not modules or not dask.config.get("quiver.warmup", default=True):
        return
    workers = tuple(sorted(getattr(client, "scheduler_info", lambda: {})().get("workers", {})))
    done = _warmed.get(id(client))
    if done is not None and (done[0]() is not client or done[1] != workers):
        done = None
    if done is not None and set(modules) <= done[2]:
        return  # the same workers imported these for an earlier run (a kept cluster's next run)
    try:
        client.run(_import_all, list(modules), on_error="ignore", callback_timeout=timeout)
    except Exception as exc:  # recorded and dropped: the warm-up is an optimisation, the run goes on
        logger.warning("warming the workers up did not finish (%s: %s); the run goes on", type(exc).__name__, exc)
        return
    _warmed.clear()  # one client remembered: the kept cluster's (a run on another starts over)
    _warmed[id(client)] = (weakref.ref(client), workers, (done[2] if done else set()) | set(modules))


#: id(client) -> (a weak reference to it, its workers' addresses, modules they imported): no
#: second round trip to the same workers for the same modules
_warmed: dict[int, tuple[Any, tuple[str, ...], set[str]]] = {}
