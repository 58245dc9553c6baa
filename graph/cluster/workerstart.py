"""How an embedded cluster's worker processes start: forked from one prepared process.

Dask's nanny starts each worker with multiprocessing's ``spawn``: a new interpreter that imports
``distributed`` and then, task by task, everything the steps need (scikit-learn about 1 s,
torch several seconds).  On two cores the two workers' imports, and the interpreters' slow
teardown at close (0.3-0.8 s), are most of what a first ``fit`` pays beyond scikit-learn.

Quiver starts an embedded cluster's workers with ``forkserver`` (Dask's
``distributed.worker.multiprocessing-method``) instead: one server process imports
``distributed`` and the run's step modules once, and every worker is a fork of it, with those
modules already imported; a worker that ends leaves without the interpreter's teardown.

Two rules keep it correct (:func:`start_method`, :func:`preloadable`; pure):

- The server's environment is fixed when it starts (the allocator and thread variables a worker
  must have before its process starts: :mod:`graph.cluster.workerenv`).  A cluster whose workers need
  other values (a changed config) is started with ``spawn``, as Dask does; so is one under a
  ``memory_budget``, whose workers' memory is measured as their resident pages (a fork's include
  every page it shares with the server).
- Only modules of installed packages (and the standard library, and Quiver itself) are imported
  in the server: a module of the user's own (a script's helper, a notebook's edited file) is
  imported fresh by each worker, so a later cluster never runs a stale copy.

``dask config quiver.embedded-cluster.start-method: spawn`` turns it off (``forkserver``,
the default, where the platform has it).

>>> start_method({"MALLOC_MMAP_THRESHOLD_": "33554432"}, server_environ=None, available=True)
'forkserver'
>>> start_method({"MALLOC_MMAP_THRESHOLD_": "131072"}, server_environ={"MALLOC_MMAP_THRESHOLD_": "33554432"},
...              available=True)
'spawn'
>>> preloadable({"sklearn.svm._classes": "/venv/lib/python3.11/site-packages/sklearn/svm/_classes.py",
...              "my_steps": "/home/me/project/my_steps.py", "graph.wrappers": "/src/graph/wrappers.py"},
...             roots=["/venv/lib/python3.11/site-packages"])
['graph.wrappers', 'sklearn.svm._classes']
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from .forkserver_preload import VARIABLE
from .workerenv import environ_restored

__all__ = ["OWN_PACKAGES", "preloadable", "start_method", "start_workers"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


_CONFIG = "quiver.embedded-cluster.start-method"
#: Quiver's own packages: a worker needs them for every run (its task wrappers)
OWN_PACKAGES = ("pipelines", "graph", "gpu")
_BASE = ["distributed", "distributed.nanny", "distributed.worker", "graph.wrappers"]

_lock = threading.Lock()
_server_environ: Any = None  # the variables the running server started with (or _BROKEN)
_BROKEN = {"<broken>": "the server failed: spawn"}  # never equal to a real environment


def start_method(environ: Mapping[str, str | None], server_environ: Mapping[str, str | None] | None,
                 available: bool, configured: str = "forkserver", budgeted: bool = False) -> str:
    """``"forkserver"`` when workers that need ``environ`` can be forks of the server (none
    started yet, or one started with the same values), else Dask's ``"spawn"``.  A cluster
    under a memory budget is always spawned: a fork's resident memory counts the pages it
    shares with the server (every module the server imported), which Dask's memory monitor and
    the budget would charge to the worker."""
    if configured not in ("forkserver", "spawn"):
        raise ValueError(f"dask config {_CONFIG!r} = {configured!r}: give 'forkserver' (workers forked from "
                         f"one prepared process) or 'spawn' (Dask's default)")
    if configured == "spawn" or not available or budgeted:
        return "spawn"
    if server_environ is not None and dict(server_environ) != dict(environ):
        return "spawn"
    return "forkserver"


def preloadable(files: Mapping[str, str | None], roots: Iterable[str]) -> list[str]:
    """The modules (name -> file) the server may import: Quiver's own, and those whose file lies
    under one of ``roots`` (site-packages, the standard library); sorted."""
    roots = [r.rstrip(os.sep) + os.sep for r in roots if r]
    keep = []
    for name, file in files.items():
        if name.split(".")[0] in OWN_PACKAGES or (file and any(file.startswith(r) for r in roots)):
            keep.append(name)
    return sorted(keep)


def _roots() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if paths.get(k)})


def _configured() -> str:
    import dask

    return str(dask.config.get(_CONFIG, default="forkserver"))


def start_workers(make: Callable[[str], T], environ: Mapping[str, str | None], modules: Iterable[str] = (),
                  budgeted: bool = False, meanwhile: Callable[[], None] | None = None) -> tuple[T, str]:
    """``(make(method), method)``: ``make`` starts a cluster whose nannies (Dask's) start their
    workers with ``method``, forks of Quiver's server (started on first use with the
    ``modules`` :func:`preloadable` allows, already imported here) where :func:`start_method`
    allows.  When a start with forks fails (the server could not start or died, e.g. a
    preloaded module failing in it), the failure is logged, the server is not used again in
    this process, and ``make`` is called once more with Dask's ``spawn``.  ``environ``: the
    variables the workers need, as this process's environment has them when the nannies start.
    ``meanwhile``: work for this process while a server it has just started imports (the
    server's imports, seconds, are the start's longest part), before the scheduler starts."""
    import dask

    global _server_environ
    available = "forkserver" in multiprocessing.get_all_start_methods() and _server_environ is not _BROKEN
    with _lock:
        method = start_method(environ, _server_environ, available, _configured(), budgeted)
        if method == "forkserver" and _server_environ is None:
            from .._dask import forkserver_preload_ours

            names = [m for m in modules if m in sys.modules]
            files = {m: getattr(sys.modules[m], "__file__", None) for m in names}
            # Dask's own preload list would import pandas into this process: ours replaces it
            forkserver_preload_ours()
            # one module that imports the rest each on its own (graph.cluster.forkserver_preload): a bare
            # list would let one module's error kill the server, and Dask's nanny wait for ever
            multiprocessing.get_context("forkserver").set_forkserver_preload(["graph.cluster.forkserver_preload"])
            listed = ",".join(_BASE + preloadable(files, _roots()))
            try:
                _start_server({**environ, VARIABLE: listed})
                _server_environ = dict(environ)
            except OSError as exc:  # logged: the workers are spawned instead
                _give_up(exc)
                method = "spawn"
            else:
                if meanwhile is not None:
                    meanwhile()
    if method == "forkserver":
        try:
            with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
                return make("forkserver"), "forkserver"
        except Exception as exc:  # logged, then the start is tried once more with spawn
            with _lock:
                _give_up(exc)
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        return make("spawn"), "spawn"


def _give_up(exc: BaseException) -> None:
    global _server_environ
    _server_environ = _BROKEN
    logger.warning("starting workers as forks of a prepared process failed (%s: %s); this process "
                   "spawns its workers from now on (dask config %s: spawn does so from the start)",
                   type(exc).__name__, exc, _CONFIG)


def _start_server(environ: Mapping[str, str | None]) -> None:
    """Start the server now, with ``environ`` in its environment: its imports then run while
    this process starts the scheduler (the first worker's start waits for them)."""
    from multiprocessing import forkserver

    with environ_restored(environ, environ):
        forkserver.ensure_running()
