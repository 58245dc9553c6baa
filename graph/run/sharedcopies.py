"""Shared inputs of training on every worker: the value that several training steps read is
copied to the other workers once, the moment it exists (docs/architecture.md §4, issue 23).

Why: an exploration of training runs starts narrow: a source (the data set) or a prefix, then
many training steps that all read it. The worker that computed it starts training at once; every
other worker's first training task must first fetch the value from it, through an event loop that
a training step holding the GIL keeps busy, and pays the transfer on its critical path. Asking the
other workers to fetch it as soon as it is in memory (Dask's own ``acquire-replicas``, sent by a
scheduler plugin in the same scheduler event that hands out its readers, ahead of them) starts
every copy before the holder is busy. Only data moves: no step runs again.

What is copied is the rule :func:`shared_inputs` (pure): a result that at least two training
steps read (iterative steps, packed training tasks), never in a memory-budgeted run (its plan
counts one copy of each result). :func:`copy_targets` (pure) says which workers fetch it: every
other worker, least busy first, at most one fewer than its readers (the holder runs one itself).

>>> deps = {"data": {"fit-1", "fit-2", "fit-3"}, "fit-1": set(), "fit-2": set(), "fit-3": set()}
>>> shared_inputs(deps, training={"fit-1", "fit-2", "fit-3"})
{'data': 3}
>>> copy_targets("tcp://a", ["tcp://a", "tcp://b", "tcp://c"], readers=3, occupancy={"tcp://b": 3})
['tcp://c', 'tcp://b']

The thin part: :class:`CopyShared` (a ``SchedulerPlugin``), which the run (``pipelines/runner.py``)
installs with :func:`install` before it submits anything and removes with :func:`remove` when it
ends, on every path, with bounded waits.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from .._dask import acquire_replicas
from ..bounded import within
from ..state.machine import runs_iterative
from . import runplugins
from .runplugins import RunPlugin

__all__ = ["COPY_STIMULUS", "CopyShared", "copy_targets", "install", "install_shared", "remove", "shared_inputs",
           "training_keys"]

logger = logging.getLogger(__name__)

#: the prefix of the stimulus id of every copy asked for (a worker's log names it as the cause)
COPY_STIMULUS = "quiver-copy"


def shared_inputs(dependents: Mapping[str, Iterable[str]], training: Iterable[str], budgeted: bool = False,
                  min_readers: int = 2) -> dict[str, int]:
    """The keys whose result at least ``min_readers`` of the ``training`` tasks read, with the
    number of tasks that read it (training or not). ``budgeted``: a memory-budgeted run, whose
    plan counts one copy of each result: nothing is copied.

    >>> shared_inputs({"a": {"t1", "x"}, "b": {"t1", "t2", "y"}}, training={"t1", "t2"})
    {'b': 3}
    >>> shared_inputs({"b": {"t1", "t2"}}, training={"t1", "t2"}, budgeted=True)
    {}
    """
    if min_readers < 2:
        raise ValueError(f"shared_inputs: min_readers must be at least 2 (a result read once is never shared), "
                         f"got {min_readers}")
    if budgeted:
        return {}
    training = set(training)
    out = {}
    for key, readers in dependents.items():
        readers = set(readers)
        if len(readers & training) >= min_readers:
            out[key] = len(readers)
    return out


def copy_targets(holder: str, workers: Iterable[str], readers: int, occupancy: Mapping[str, int]) -> list[str]:
    """The workers that fetch a copy now: every worker but the holder, at most ``readers - 1``
    of them (the holder runs one reader itself), the least occupied first (ties: address order).

    >>> copy_targets("a", ["a", "b"], readers=12, occupancy={})
    ['b']
    >>> copy_targets("a", ["c", "b", "a", "d"], readers=3, occupancy={"b": 1, "c": 1, "d": 2})
    ['b', 'c']
    >>> copy_targets("a", ["a"], readers=4, occupancy={})
    []
    """
    others = sorted((w for w in set(workers) if w != holder), key=lambda w: (occupancy.get(w, 0), w))
    return others[: max(0, readers - 1)]


def training_keys(compiled: Any) -> set[str]:
    """The compiled run's training tasks: its iterative steps' tasks (the state machine's rule,
    :func:`graph.state.machine.runs_iterative`, which looks under a run's wrappers too) and its
    packed training tasks (``compiled.packed``)."""
    graph = getattr(compiled, "graph", {})
    found = {k for k, t in graph.items() if runs_iterative(t)}
    return found | set(getattr(compiled, "packed", None) or ())


class CopyShared(RunPlugin):
    """On the scheduler: asks the other workers to fetch each of one run's shared inputs (``shared``:
    ``{key: readers}``, :func:`shared_inputs`) the moment it is in memory, once per key. Records
    the copies asked for in ``requested`` (``{key: [worker, ...]}``), which :func:`remove` returns."""

    def __init__(self, name: str, shared: Mapping[str, int]):
        super().__init__(name)
        self.shared = dict(shared)
        self.requested: dict[str, list[str]] = {}

    def outcome(self) -> dict[str, list[str]]:
        return dict(self.requested)

    def transition(self, key, start, finish, *args, **kwargs: Any) -> None:
        # called for every transition of every task: return at once unless a shared input just
        # came into memory (a recompute copy, "<key>~againN", is its key's value too)
        if finish != "memory" or self._scheduler is None:
            return
        from ..keys import original_key

        name = original_key(key) if isinstance(key, str) else key
        if name not in self.shared or name in self.requested:
            return
        s = self._scheduler
        ts = s.tasks.get(key)
        if ts is None or not ts.who_has:
            return
        holder = next(iter(ts.who_has)).address
        occupancy = {addr: len(ws.processing) for addr, ws in s.workers.items()}
        targets = copy_targets(holder, s.workers, self.shared[name], occupancy)
        stimulus = f"{COPY_STIMULUS}-{uuid.uuid4().hex[:8]}"
        asked = []
        for addr in targets:
            try:  # straight onto the worker's stream: ahead of the readers' compute-task messages
                acquire_replicas(s, addr, [key], stimulus)
            except Exception as exc:  # recorded: a worker leaving meanwhile; the copy was only a head start
                logger.debug("quiver: no copy of %s on %s: %s", key, addr, exc)
                continue
            asked.append(addr)
        self.requested[name] = asked


def install(client: Any, compiled: Any, budgeted: bool = False, timeout: float = 10.0,
            training: Iterable[str] | None = None) -> str | None:
    """Register a :class:`CopyShared` for ``compiled``'s shared inputs on ``client``'s scheduler;
    returns its name (``None``: nothing shared, one worker, or the scheduler did not answer within
    ``timeout`` s: the copies were only a head start, the run goes on without them).
    ``training``: the readers that count (default :func:`training_keys`; a benchmark measuring
    copies ahead of any step passes every key). ``dask config quiver.shared-copies: False`` turns
    it off."""
    import dask

    if not dask.config.get("quiver.shared-copies", default=True):
        return None
    shared = shared_inputs(compiled.dependents, training_keys(compiled) if training is None else training, budgeted)
    return install_shared(client, shared, timeout)


def install_shared(client: Any, shared: Mapping[str, int], timeout: float = 10.0) -> str | None:
    """Register a :class:`CopyShared` for ``shared`` (``{key: readers}``) on ``client``'s
    scheduler: for a run whose shared inputs are known without a compiled run (an adaptive
    search: the keys every trial reads, ``graph.compiling.trials.common_keys``). Returns its
    name, or ``None`` as :func:`install` does. ``dask config quiver.shared-copies: False`` turns it off."""
    import dask

    if not shared or not dask.config.get("quiver.shared-copies", default=True):
        return None
    deadline = time.monotonic() + timeout
    try:
        if len(within(deadline, client.nthreads, what="counting the workers")) < 2:
            return None
    except Exception as exc:  # recorded: the copies are only a head start, a run never fails for them
        logger.info("quiver: shared inputs not copied ahead (%s: %s)", type(exc).__name__, exc)
        return None
    return runplugins.install(client, CopyShared(runplugins.plugin_name("quiver-copies"), shared),
                              max(0.0, deadline - time.monotonic()), "the shared copies")


def remove(client: Any, name: str | None, timeout: float = 10.0) -> dict[str, list[str]]:
    """Unregister the plugin ``name`` (waiting ``timeout`` s at most in all); returns the copies it
    asked for (``{key: workers}``; ``{}`` when nothing was installed or the scheduler did not say)."""
    return runplugins.remove(client, name, {}, timeout, "the shared copies")
