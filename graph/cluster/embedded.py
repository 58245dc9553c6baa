"""The embedded ``LocalCluster`` a process keeps between runs, as joblib keeps its worker pool.

A script or notebook that calls ``.run()`` or a drop-in search's ``fit`` several times would
otherwise start and close a cluster of fresh worker processes every time (about 2-3 s on two
cores, plus the steps' imports again in the new workers).  One kept cluster is shared by
consecutive runs that ask for the same shape (workers, threads, memory limits, budget).  It is
closed:

- after ``quiver.embedded-cluster.idle-timeout`` seconds without a run (dask config, default
  300, as joblib's pool; ``0``: close after every run, the behaviour before keeping),
- when a run asks for another shape (the old one is closed first, so two never coexist),
- when a run using it fails (a cluster that a failure may have left paused or short of workers
  is never handed to the next run),
- and at interpreter exit.

Runs in concurrent threads never share it: a run that finds it in use starts its own cluster
for itself, closed afterwards.

>>> import dask
>>> with dask.config.set({"quiver.embedded-cluster.idle-timeout": 60}):
...     idle_timeout()
60.0
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["acquire", "close_kept", "idle_timeout", "kept", "on_close", "release", "settle_kept"]

_CONFIG = "quiver.embedded-cluster.idle-timeout"
_lock = threading.RLock()
_kept: dict[str, Any] = {}  # "spec", "cluster", "client", "busy", "timer"


def idle_timeout() -> float:
    """Seconds a kept cluster waits for the next run (``0``: not kept)."""
    import dask

    value = dask.config.get(_CONFIG, default=300)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"dask config {_CONFIG!r} = {value!r}: give seconds (0 closes the "
                         f"embedded cluster after every run)") from None
    if seconds < 0:
        raise ValueError(f"dask config {_CONFIG!r} = {value!r}: give seconds >= 0")
    return seconds


def kept() -> Any:
    """The kept cluster's client, or ``None``."""
    with _lock:
        return _kept.get("client")


def settle_kept() -> None:
    """Wait until the kept cluster, if any, has finished starting (graph.cluster.bridge)."""
    with _lock:
        cluster = _kept.get("cluster")
    if cluster is not None:
        from .bridge import settle

        settle(cluster)


def _healthy(entry: dict) -> bool:
    from .bridge import settle

    cluster, client = entry["cluster"], entry["client"]
    settle(cluster)  # one started with a bridge (graph.cluster.bridge) is handed on once it has its own workers alone
    if getattr(getattr(cluster, "_quiver_bridge", None), "error", None) is not None:
        return False  # its workers never started (graph.cluster.bridge): it ran on the user's process alone
    try:
        return (client.status == "running" and str(cluster.status.name) == "running"
                and len(cluster.scheduler_info.get("workers", {})) >= len(cluster.worker_spec))
    except (AttributeError, KeyError, TypeError):  # a cluster half-closed by an earlier failure
        return False


def acquire(spec: Hashable, start: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any, bool, bool]:
    """``(cluster, client, reused, kept)`` for a run of shape ``spec``: the kept cluster when it
    has that shape, is healthy and free; else a new one from ``start()``, kept (``kept``) unless
    keeping is off or the kept one is in use by another run."""
    keep = idle_timeout() > 0
    stale = None
    with _lock:
        entry = dict(_kept)
        if entry:
            if entry["busy"]:
                keep = False  # another thread's run holds it: this run gets its own, not kept
            elif entry["spec"] == spec and _healthy(entry):
                _cancel_timer()
                _kept["busy"] = True
                return entry["cluster"], entry["client"], True, True
            else:
                stale = _take()
    if stale:
        _close(stale)
    cluster, client = start()
    if keep:
        with _lock:
            if not _kept:
                _kept.update(spec=spec, cluster=cluster, client=client, busy=True, timer=None)
            else:  # another thread kept one meanwhile
                keep = False
    return cluster, client, False, keep


def on_close(client: Any, fn: Callable[[], None]) -> None:
    """Call ``fn`` once the kept cluster of ``client`` is closed."""
    with _lock:
        if _kept.get("client") is client:
            _kept.setdefault("finalizers", []).append(fn)


def release(client: Any, ok: bool) -> None:
    """The run using the kept cluster ``client`` ended: wait for the next run (``ok``), or
    close it (a failed run)."""
    with _lock:
        if _kept.get("client") is not client:
            return
        if not ok or idle_timeout() <= 0:
            entry = _take()
        else:
            _kept["busy"] = False
            timer = threading.Timer(idle_timeout(), _expire, args=(client,))
            timer.daemon = True
            _kept["timer"] = timer
            timer.start()
            return
    _close(entry)


def close_kept() -> None:
    """Close the kept cluster now (also called at interpreter exit)."""
    with _lock:
        entry = _take() if _kept else None
    if entry:
        _close(entry)


def _expire(client: Any) -> None:
    with _lock:
        if _kept.get("client") is not client or _kept["busy"]:
            return
        entry = _take()
    _close(entry)


def _cancel_timer() -> None:
    timer = _kept.get("timer")
    if timer is not None:
        timer.cancel()
        _kept["timer"] = None


def _take() -> dict:
    _cancel_timer()
    entry = dict(_kept)
    _kept.clear()
    return entry


def _close(entry: dict) -> None:
    from .bridge import settle

    settle(entry["cluster"], closed=True)  # a start still under way ends before the cluster closes
    for part in ("client", "cluster"):
        try:
            entry[part].close()
        except Exception as exc:  # reported, never raised: closing an idle cluster must not fail a run
            print(f"[quiver] closing the kept embedded cluster's {part} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
    for fn in entry.get("finalizers", ()):
        fn()


atexit.register(close_kept)
