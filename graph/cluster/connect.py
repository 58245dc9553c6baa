"""Where a run executes: a given client, a scheduler address, or an embedded ``LocalCluster``.

>>> with connect(n_workers=1, quiet=True) as client:          # doctest: +SKIP
...     client.dashboard_link
'http://127.0.0.1:8787/status'
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from distributed import Client, LocalCluster

from ..bounded import answered
from gpu.clusters import default_workers

__all__ = ["connect", "unguarded_main_call", "workers_skip_main"]


#: how long started workers may take to register with the scheduler before the start counts as failed
REGISTER_SECONDS = 60.0

_skip_main_lock = threading.Lock()
_skip_main_holders = 0
_original_preparation: Any = None


def _hold_skip_main() -> None:
    global _skip_main_holders, _original_preparation
    import multiprocessing.spawn as spawn

    with _skip_main_lock:
        _skip_main_holders += 1
        if _skip_main_holders > 1:
            return
        original = _original_preparation = spawn.get_preparation_data

        def get_preparation_data(name: str) -> dict:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = get_preparation_data


def _drop_skip_main() -> None:
    global _skip_main_holders
    import multiprocessing.spawn as spawn

    with _skip_main_lock:
        _skip_main_holders -= 1
        if _skip_main_holders == 0:
            spawn.get_preparation_data = _original_preparation


def unguarded_main_call() -> tuple[str, int] | None:
    """``(file, line)`` of the statement of the main script that led here when it is not under an
    ``if __name__ == "__main__":`` guard; ``None`` otherwise (a notebook, ``python -c``, a guarded
    call, the ``quiver`` CLI's own main).

    >>> unguarded_main_call() is None   # a doctest's __main__ is not a script
    True
    """
    import ast
    import inspect

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py") or not os.path.exists(path):
        return None
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_code.co_name == "<module>"
                                     and frame.f_globals.get("__name__") == "__main__"):
        frame = frame.f_back
    if frame is None or not os.path.exists(frame.f_code.co_filename) \
            or not os.path.samefile(frame.f_code.co_filename, path):
        return None
    line = frame.f_lineno
    try:
        stamp = (str(path), line, os.stat(path).st_mtime_ns)
        if stamp not in _guarded:
            with open(path) as f:
                tree = ast.parse(f.read())
            _guarded.clear()
            _guarded[stamp] = any(stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) and _is_main_guard(stmt)
                                  for stmt in tree.body)
    except (OSError, SyntaxError, ValueError):
        return None
    return None if _guarded[stamp] else (str(path), line)


#: (main script, line, its mtime) -> whether the line is under a main guard (one entry: the last asked)
_guarded: dict[tuple, bool] = {}
#: whether the run connect() is starting was called from an unguarded main script (read on its thread)
_main_unguarded: bool | None = None


def _is_main_guard(stmt: Any) -> bool:
    import ast

    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


@contextlib.contextmanager
def workers_skip_main(unguarded: bool | None = None) -> Iterator[None]:
    """While open, processes started with multiprocessing's ``spawn`` (how Dask's nannies start
    workers) do not re-run the parent's main script, when that script is unguarded
    (``unguarded``; ``None``: :func:`unguarded_main_call` tells). A guarded script, a notebook
    and the ``quiver`` CLI leave multiprocessing as it is (issue 50: the patch is process-wide, and
    a guarded script's own spawned processes need their re-run of ``__main__``).

    ``spawn`` normally re-imports the main script in every child (as ``__mp_main__``), so a
    script that calls ``.run()`` at module level without an ``if __name__ == "__main__":``
    guard would start a cluster inside each worker's bootstrapping, which fails there and
    leaves the run waiting for workers forever.  Workers do not need the script: cloudpickle
    ships functions and classes defined in ``__main__`` by value.  Only the preparation data
    of children started meanwhile changes (no ``init_main_from_path``/``init_main_from_name``);
    ``__main__`` itself (its ``__file__``, its globals) is untouched.  Holders are counted, so
    a kept embedded cluster (whose nannies may restart a worker at any time) and the runs on
    it may open and close it in any order.

    >>> import multiprocessing.spawn as spawn
    >>> with workers_skip_main(unguarded=True):
    ...     "init_main_from_path" in spawn.get_preparation_data("probe")
    False
    """
    if unguarded is None:  # what connect() read on the caller's thread, else read here
        unguarded = _main_unguarded if _main_unguarded is not None else unguarded_main_call() is not None
    if not unguarded:  # a guarded script, a notebook, the CLI: multiprocessing as it is
        yield
        return
    _hold_skip_main()
    try:
        yield
    finally:
        _drop_skip_main()


@contextlib.contextmanager
def connect(
    client: Any = None,
    *,
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    memory_limit: str | int | None = "auto",
    dashboard_address: str = "127.0.0.1:0",
    quiet: bool = False,
    memory_budget: Any = None,
    info: dict | None = None,
    preload: tuple[str, ...] | list[str] = (),
    bridge: bool = False,
) -> Iterator[Client]:
    """Yield a ``distributed.Client``.

    ``client`` may be a ``Client`` (used as is, left open), a scheduler address
    string such as ``"tcp://127.0.0.1:8786"`` (connected to, then disconnected), or
    ``None``: an embedded ``LocalCluster`` of worker processes on loopback.  The dashboard
    link is printed unless ``quiet``.

    The embedded cluster is kept for the process's next run of the same shape
    (:mod:`graph.cluster.embedded`: idle timeout, closed after a failed run and at exit), except
    under a ``memory_budget``, whose workers carry a run's planned spill settings.  Its
    workers get Quiver's allocator setting (:mod:`graph.cluster.workerenv`).

    ``memory_budget`` (embedded cluster only): the total for all workers, split
    evenly into their ``memory_limit``; each worker keeps its results in a
    :class:`graph.memory.spill.PlannedSpillBuffer` so a run's memory plan decides what
    is spilled first.

    ``info`` (optional dict) is filled with ``cluster``: ``"given"``, ``"connected"``,
    ``"started"`` or ``"reused"``, ``start_method`` for a started one, and ``bridge``: ``True``
    when a started one began with this process as its worker.

    ``preload``: modules the run's steps need (:func:`graph.cluster.warmup.step_modules`); a new
    embedded cluster's workers are forked from a process that imported them
    (:mod:`graph.cluster.workerstart`).

    ``bridge``: the run is one of plain steps (:func:`graph.cluster.bridge.eligible`); a new embedded
    cluster without a budget is yielded as soon as its scheduler is up, with this process as
    its worker until its own have started (:mod:`graph.cluster.bridge`; dask config
    ``quiver.embedded-cluster.bridge: false`` turns it off).
    """
    info = {} if info is None else info
    if isinstance(client, Client):
        info["cluster"] = "given"
        yield client
        return
    if isinstance(client, str):
        info["cluster"] = "connected"
        with Client(client) as c:
            _announce(c, "scheduler " + client, quiet)
            yield c
        return
    if client is not None:
        raise TypeError(
            f"client must be a distributed.Client, a scheduler address or None, not {type(client).__name__}"
        )
    kwargs: dict[str, Any] = dict(
        n_workers=n_workers or default_workers(),
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        dashboard_address=dashboard_address,
    )
    if memory_budget is not None:
        from ..memory.budget import worker_limits
        from ..memory.limits import dask_thresholds
        from ..memory.spill import PlannedSpillBuffer

        limit = worker_limits(memory_budget, kwargs["n_workers"])
        kwargs["memory_limit"] = limit
        target = dask_thresholds().target  # Dask's own spill target (dask.config) until a plan sets its own
        kwargs["data"] = (PlannedSpillBuffer, {"target": int(limit * target) if target else limit})
    elif memory_limit is not None:
        kwargs["memory_limit"] = memory_limit
    from . import embedded

    # read on this (the caller's) thread: the workers may start on the bridge's thread, whose frames
    # do not reach the main script's statement (graph.cluster.bridge)
    global _main_unguarded
    _main_unguarded = unguarded_main_call() is not None
    # a kept cluster whose workers are still starting (graph.cluster.bridge) first finishes its start:
    # until then this process's config and environment hold the start's settings for its nannies
    embedded.settle_kept()
    if bridge:  # never under a budget: its workers' memory is planned from their start
        from .bridge import enabled

        bridge = memory_budget is None and enabled()

    def start() -> tuple[Any, Any]:
        cluster, c = _start_embedded(kwargs, memory_budget, preload, info, bridge=bridge)
        return cluster, c

    if memory_budget is not None:  # never kept: its workers carry one run's planned spill settings
        cluster, c, reused, keep = (*start(), False, False)
    else:
        from .workerenv import embedded_config, embedded_environ

        # the workers' settings too: a run after a config change never gets workers made without it
        spec = (kwargs["n_workers"], threads_per_worker, memory_limit, dashboard_address,
                tuple(sorted(embedded_environ(None).items())), tuple(sorted(embedded_config().items())))
        cluster, c, reused, keep = embedded.acquire(spec, start)
        if keep and not reused and _main_unguarded:  # a kept cluster's nannies may restart a worker between runs too
            _hold_skip_main()
            embedded.on_close(c, _drop_skip_main)
    info["cluster"] = "reused" if reused else "started"
    _announce(c, f"embedded LocalCluster ({kwargs['n_workers']} workers"
                 + (", kept from the last run)" if reused else ")"), quiet)
    if keep:
        ok = False
        try:
            # workers_skip_main: a script without an ``if __name__ == "__main__":`` guard works
            # too (workers, restarted ones included, never re-run it); see its docstring
            with workers_skip_main():
                yield c
            ok = True
        finally:
            embedded.release(c, ok)  # kept for the next run, or closed after a failure
        return
    with workers_skip_main(), _closing_after_errors(cluster), _settling(cluster), _closing_after_errors(c):
        yield c


@contextlib.contextmanager
def _settling(cluster: Any) -> Iterator[None]:
    """On the way out, wait for ``cluster``'s workers' start and bridge (:mod:`graph.cluster.bridge`)."""
    from .bridge import settle

    try:
        yield
    finally:
        settle(cluster, closed=True)


def _start_embedded(kwargs: dict, memory_budget: Any, preload: Any = (), info: dict | None = None,
                    bridge: bool = False) -> tuple[Any, Any]:
    """A new embedded cluster and its client, with Quiver's dashboard pages and log digest.
    ``bridge``: return as soon as the scheduler is up, with the user's process as a worker
    until the cluster's own have started (:mod:`graph.cluster.bridge`)."""
    if bridge:
        from .bridge import Bridge

        helper = Bridge()
        cluster = helper.begin(lambda hand: _started(kwargs, memory_budget, preload, info, hand))
        if info is not None:
            info["bridge"] = True
    else:
        helper, cluster = None, _started(kwargs, memory_budget, preload, info)
    try:
        if helper is None:
            c = Client(cluster)
        else:  # ``Client(cluster)`` would wait for the workers (it awaits the cluster's start)
            c = Client(cluster.scheduler_address, loop=cluster.loop, security=cluster.security)
            c.cluster = cluster
    except BaseException:  # re-raised: the cluster without a client is closed first
        _close_started(cluster)
        raise
    try:
        if helper is not None:
            helper.attach()
        from ..dashboard import ensure_dashboard

        ensure_dashboard(c)  # Quiver's dashboard pages exist before the first run starts
        from ..report.logdigest import ErrorDigestPlugin, dask_logs

        answered(c.register_plugin, ErrorDigestPlugin(summary=dask_logs() == "summary"), what="registering the error digest")  # one log line per kind of task error, with a count
        from .heartbeats import QuietClosePlugin

        answered(c.register_plugin, QuietClosePlugin(), what="registering the quiet-close plugin")  # no heartbeat races a worker's close (its traceback)
    except BaseException:  # re-raised: a cluster whose set-up failed is closed first
        c.close()
        _close_started(cluster)
        raise
    return cluster, c


def _close_started(cluster: Any) -> None:
    """Close a cluster this process started, once its workers' start (and bridge) ended."""
    from .bridge import settle

    settle(cluster, closed=True)
    cluster.close()


def _started(kwargs: dict, memory_budget: Any, preload: Any = (), info: dict | None = None,
             hand: Any = None) -> Any:
    """A new embedded ``LocalCluster`` with its workers started (forked or spawned,
    :mod:`graph.cluster.workerstart`).  ``hand``: called with the cluster as soon as its scheduler is
    up, before its workers start (the bridge's start, in a thread of its own)."""
    import dask

    from .workerenv import embedded_config, embedded_environ, environ_restored
    from .workerstart import start_workers

    ours = embedded_environ(memory_budget)
    spawn_config = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    variables = set(ours) | set(spawn_config)
    # Dask's nanny lets this process's environment override its config, and a nanny that restarted
    # a worker earlier (another cluster, a budgeted run) leaves its values there: say ours in the
    # environment too, for the nannies' start. Dask's nannies also write the workers' variables
    # into this process's environment: it is put back afterwards, so that processes this one
    # starts later (scikit-learn's joblib workers, a subprocess) get their allocator and thread
    # settings from the user, not Dask
    # the workers' Dask config is this process's when their nannies start (Dask hands it over)
    with workers_skip_main(), dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in ours.items()}), \
            dask.config.set(embedded_config(memory_budget)), environ_restored(variables, ours):
        # what the workers' processes must start with (as the nanny will compute it): forks of
        # Quiver's prepared process only when that process started with the same
        needed = {k: os.environ.get(k, None if spawn_config.get(k) is None else str(spawn_config[k]))
                  for k in sorted(variables)}
        made: list = []

        def make(method: str) -> Any:
            options = dict(kwargs)
            if method == "forkserver":
                # a fork keeps its server's environment: the rest of this process's (what a
                # spawned worker would inherit) is set in each worker as it starts
                options["env"] = {k: v for k, v in os.environ.items() if k not in variables}
            if info is not None:
                info["start_method"] = method
            if hand is None:
                return LocalCluster(**options)
            # the scheduler first, handed over at once; then the workers, waited for here
            if not made:
                if "memory_limit" not in options:  # what LocalCluster gives n workers, not 0
                    from distributed.worker_memory import parse_memory_limit

                    options["memory_limit"] = parse_memory_limit("auto", 1, kwargs["n_workers"])
                made.append(LocalCluster(**dict(options, n_workers=0)))
                hand(made[0])
                import_table_library()  # here, not before the scheduler: the run starts first
            cluster = made[0]
            if cluster.workers:  # a failed start with forks: its workers go before a spawned start
                cluster.scale(0)
                cluster.sync(_settled, cluster)
            cluster.scale(kwargs["n_workers"])
            cluster.sync(_workers_in, cluster, kwargs["n_workers"])
            return cluster

        from ..report.table import import_table_library

        # the run's table needs pandas at its end: imported while the workers' server imports
        cluster, _ = start_workers(make, needed, preload, budgeted=memory_budget is not None,
                                   meanwhile=import_table_library if hand is None else None)
    return cluster


async def _settled(cluster: Any) -> None:
    """Return once ``cluster``'s workers match its spec (``SpecCluster.__await__``: Dask starts or
    closes them, and raises what a start raised)."""
    await cluster


async def _workers_in(cluster: Any, n: int) -> None:
    """Wait until ``cluster``'s own ``n`` workers (its spec's) have started and registered."""
    import asyncio

    from .bridge import NAME

    import time

    await cluster  # Dask's own: the cluster's workers match its spec (started, or an error raised)
    deadline = time.monotonic() + REGISTER_SECONDS
    from distributed.core import Status

    while sum(ws.name != NAME for ws in cluster.scheduler.workers.values()) < n:
        failed = [name for name, w in cluster.workers.items() if getattr(w, "status", None) in (Status.failed, Status.closed)]
        if failed:  # a nanny whose worker process did not start: the start failed now, not at the deadline
            raise RuntimeError(f"the worker process of {', '.join(map(str, failed))} did not start")
        if time.monotonic() > deadline:  # a worker started but never registered: not waited for ever
            raise TimeoutError(f"{n} workers started but did not register with the scheduler within "
                               f"{REGISTER_SECONDS:.0f} s")
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def _closing_after_errors(thing: Any) -> Iterator[Any]:
    """Close ``thing`` (a cluster or client) on the way out; when the body raised, a failure to
    close (e.g. ``LocalCluster.close`` timing out after a worker died) is printed, never raised,
    so the run's own error is the one the user sees."""
    try:
        yield thing
    except BaseException:  # re-raised after closing: the body's error is the one the user sees
        try:
            thing.close()
        except Exception as exc:  # the body's error wins; the close failure is only reported
            print(f"[quiver] closing the embedded cluster after an error also failed: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
    thing.close()


def _announce(client: Client, what: str, quiet: bool) -> None:
    if quiet:
        return
    link = client.dashboard_link if client.scheduler_info().get("services", {}).get("dashboard") else None
    msg = f"[quiver] running on {what}"
    if link:
        msg += f"; dashboard: {link}"
    print(msg, file=sys.stderr, flush=True)
