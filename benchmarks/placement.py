"""Placement: copy a result that several steps read to the other workers the moment it exists.

Why: a step that holds the GIL for seconds (scipy's SVD inside ``PCA(svd_solver="full")``)
also blocks its worker's event loop, so that worker cannot serve the results it holds. When
the worker that computed a shared result (an exploration's prefix) starts such a step at once,
every other worker that needs the result waits for the whole step. Asking the other workers
to fetch it as soon as it is in memory (Dask's own ``acquire-replicas``, from a scheduler
plugin, in the same scheduler event that hands out its consumers) starts the transfer before
the holder is busy; the consumers scheduled elsewhere then find the copy already there or on
its way.

The decisions are pure functions of literal inputs:

>>> deps = {"load": {"pca-8", "pca-16"}, "pca-8": {"fit-1"}, "pca-16": {"fit-2"}, "fit-1": set(), "fit-2": set()}
>>> shared_results(deps)
{'load': 2}
>>> replica_targets("tcp://a", ["tcp://a", "tcp://b", "tcp://c"], consumers=2, occupancy={"tcp://b": 3, "tcp://c": 0})
['tcp://c']

and a thin layer talks to the cluster: :class:`ReplicateShared` (a ``SchedulerPlugin``),
installed for one run by :func:`install` and removed by :func:`remove`.  Quiver's driver does
not call it: ``benchmarks/explore_vs_naive.py`` (variant a') installs it around a run, to
measure what it would give, so it lives here with the benchmark rather than in the library
(``import placement`` with ``benchmarks/`` on ``sys.path``, as the benchmark runs).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["ReplicateShared", "install", "remove", "replica_targets", "shared_results"]

logger = logging.getLogger(__name__)


def shared_results(dependents: Mapping[str, Iterable[str]], min_consumers: int = 2) -> dict[str, int]:
    """The keys whose result at least ``min_consumers`` step tasks read, with that count.

    >>> shared_results({"a": {"b"}, "b": set()})
    {}
    >>> shared_results({"a": {"b", "c", "d"}, "b": set(), "c": set(), "d": set()}, min_consumers=3)
    {'a': 3}
    """
    if min_consumers < 2:
        raise ValueError(f"min_consumers must be at least 2 (a result read once is never shared), got {min_consumers}")
    out = {}
    for key, consumers in dependents.items():
        n = len(set(consumers))
        if n >= min_consumers:
            out[key] = n
    return out


def replica_targets(holder: str, workers: Iterable[str], consumers: int, occupancy: Mapping[str, int]) -> list[str]:
    """Workers that should fetch a copy now: at most ``consumers - 1`` of them (the holder runs
    one consumer itself), never the holder, the least occupied first (ties: address order).

    >>> replica_targets("a", ["a", "b"], consumers=5, occupancy={})
    ['b']
    >>> replica_targets("a", ["c", "b", "a", "d"], consumers=3, occupancy={"b": 1, "c": 1, "d": 2})
    ['b', 'c']
    >>> replica_targets("a", ["a"], consumers=4, occupancy={})
    []
    """
    others = sorted((w for w in set(workers) if w != holder), key=lambda w: (occupancy.get(w, 0), w))
    return others[: max(0, consumers - 1)]


class ReplicateShared(SchedulerPlugin):
    """Asks other workers to fetch each shared result of one run as soon as it is in memory.

    ``shared``: ``{key: number of consumers}`` (:func:`shared_results`). Records what it asked
    for in ``requested`` (``{key: [worker, ...]}``), which :func:`remove` returns.
    """

    def __init__(self, name: str, shared: Mapping[str, int]):
        self.name = name
        self.shared = dict(shared)
        self.requested: dict[str, list[str]] = {}
        self._scheduler = None

    async def start(self, scheduler) -> None:
        self._scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        if finish != "memory" or start != "processing" or key not in self.shared or self._scheduler is None:
            return
        s = self._scheduler
        ts = s.tasks.get(key)
        if ts is None or not ts.who_has:
            return
        holder = next(iter(ts.who_has)).address
        occupancy = {addr: len(ws.processing) for addr, ws in s.workers.items()}
        targets = replica_targets(holder, s.workers, self.shared[key], occupancy)
        stimulus = f"quiver-replicate-{uuid.uuid4().hex[:8]}"
        for addr in targets:
            try:
                s.request_acquire_replicas(addr, [key], stimulus_id=stimulus)
            except Exception as exc:  # recorded: a worker leaving meanwhile, the copy was only a head start
                logger.debug("quiver: no replica of %s on %s: %s", key, addr, exc)
                continue
        self.requested[key] = targets


def install(client: Any, compiled: Any, min_consumers: int = 2) -> str | None:
    """Register a :class:`ReplicateShared` for ``compiled``'s shared results on ``client``'s
    scheduler; returns its name (``None`` when nothing is shared or there is one worker)."""
    shared = shared_results(compiled.dependents, min_consumers)
    if not shared or len(client.scheduler_info(n_workers=-1).get("workers", {})) < 2:
        return None
    name = f"quiver-placement-{uuid.uuid4().hex[:12]}"
    client.register_plugin(ReplicateShared(name, shared))
    return name


def remove(client: Any, name: str | None) -> dict[str, list[str]]:
    """Unregister the plugin ``name``; returns which copies it asked for (``{key: workers}``)."""
    if name is None:
        return {}
    try:
        requested = client.run_on_scheduler(_requested, name=name)
        client.unregister_scheduler_plugin(name)
    except Exception as exc:  # recorded: the scheduler may be gone, nothing left to clean
        logger.debug("quiver: cannot read the replication plugin: %s", exc)
        return {}
    return requested


def _requested(dask_scheduler, name: str) -> dict[str, list[str]]:
    plugin = dask_scheduler.plugins.get(name)
    return dict(plugin.requested) if plugin is not None else {}
