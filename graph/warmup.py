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
['graph.warmup', 'sklearn.svm._classes']
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterable
from typing import Any

from .wrappers import innermost

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


def step_modules(compiled: Any) -> list[str]:
    """The importable modules a compiled run's step functions come from or name (sorted;
    ``__main__`` excluded: its functions travel by value)."""
    found: set[str] = set()
    tasks: Iterable = list(getattr(compiled, "graph", {}).values()) + list(getattr(compiled, "metric_graph", {}).values())
    for task in tasks:
        fn = innermost(getattr(task, "func", None))
        if fn is not None:
            found |= _named(fn)
    return sorted(m for m in found if m not in _SKIP and not m.startswith("<"))


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
    try:
        client.sync(client._run, _import_all, list(modules), on_error="ignore", callback_timeout=timeout)
    except Exception as exc:  # recorded and dropped: the warm-up is an optimisation, the run goes on
        logger.warning("warming the workers up did not finish (%s: %s); the run goes on", type(exc).__name__, exc)
