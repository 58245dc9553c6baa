"""The fence: every use Quiver makes of what Dask, distributed, zict and bokeh do not publish.

Quiver works on Dask's public surface (``dask.task_spec``, ``Client.run``, scheduler and worker
plugins, ``Cluster.scale`` / ``wait_for_workers``, events, ``distributed.comm``). Where a
mechanism has no public way, its one use lives here, as a small function with the reason it
exists; nothing else in Quiver names a private attribute of those packages
(``tests/test_layout.py::test_private_names_of_dask_only_in_the_fence`` checks), and each
entry of :data:`FENCED` has a canary test in ``tests/test_dask_fence.py`` that fails loudly,
naming the entry, when a Dask release changes what it relies on. ``docs/architecture.md`` §11
lists them.

Supported: dask and distributed 2026.7.1 through 2026.8.x (pyproject.toml's range, both ends
tested in CI).

>>> sorted(FENCED)[:3]
['acquire_replicas', 'bokeh_prefix', 'convert_legacy_graph']
>>> all(isinstance(reason, str) and reason for reason in FENCED.values())
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "FENCED",
    "acquire_replicas",
    "bokeh_prefix",
    "convert_legacy_graph",
    "executing_keys",
    "expression_layer",
    "forget_run_spec",
    "forkserver_preload_ours",
    "future_status_change",
    "has_expression_layers",
    "lru_evict_unlocked",
    "lru_pinned",
    "move_queued_task",
    "prefix_duration",
    "refuse_transfers",
    "spill_accounting",
    "stop_new_tasks",
    "transfers_out",
    "turn_lru",
    "worker_with_hooks",
]

#: each fenced use and why it has no public way (docs/architecture.md §11 prints this table)
FENCED: dict[str, str] = {
    "acquire_replicas": "distributed: Scheduler.request_acquire_replicas (undocumented): a copy of a shared "
    "input onto a worker's stream ahead of its readers; Client.replicate waits and goes through the client",
    "bokeh_prefix": "bokeh: BokehTornado._prefix: the dashboard's URL prefix (distributed.dashboard.prefix) "
    "as the running server applied it",
    "convert_legacy_graph": "dask: dask._task_spec.convert_legacy_graph: a collection's tuple-style graph as "
    "dask.task_spec nodes (dask.task_spec does not export it)",
    "executing_keys": "distributed: Worker.state.executing (undocumented): the bridge waits for its running task",
    "expression_layer": "dask: Expr._name / Expr._layer(): one expression's layer, so that branches sharing "
    "upstream expressions build it once per compile (Expr.__dask_graph__ rebuilds every layer)",
    "forget_run_spec": "distributed: WorkerTaskState.run_spec = None once a task's result is in memory: "
    "the step's arguments (large parcels) are not kept beside its result",
    "forkserver_preload_ours": "distributed: distributed.utils._forkserver_preload_set: Dask's own forkserver "
    "preload (which imports pandas into the user's process) is replaced by Quiver's",
    "future_status_change": "distributed: Future._state.wait(): wait for a future's status on the client's "
    "loop without a thread hand-off per future (add_done_callback hands off to a thread)",
    "lru_evict_unlocked": "zict: LRU.evict.__wrapped__: the memory plan's victim, evicted with zict's "
    "one-level lock (zict releases it while writing to disk)",
    "lru_pinned": "zict: LRU._cancel_evict: keys zict must not evict right now",
    "move_queued_task": "distributed: WorkStealing.move_task_request: hand the bridge's queued tasks to "
    "the workers when they arrive (retire_workers moves only results)",
    "prefix_duration": "distributed: Scheduler._get_prefix_duration: Dask's own estimate of a task's "
    "duration, the spread's placement objective",
    "refuse_transfers": "distributed: Worker.transfer_outgoing_count_limit = 0: a retiring bridge answers "
    "'busy' (Dask's own reply), so fetchers go to another holder without an error",
    "spill_accounting": "distributed: SpillBuffer._capture_metrics / _handle_errors: evict one chosen key "
    "with Dask's spill counters and its handling of a full disk",
    "stop_new_tasks": "distributed: Worker.status = closing_gracefully: the bridge takes no new tasks "
    "before the scheduler retires it",
    "transfers_out": "distributed: Worker.transfer_outgoing_count: transfers from the bridge in progress",
    "turn_lru": "zict: the __class__ of a running worker's SpillBuffer.fast (a zict.LRU) becomes "
    "PlannedLRU: same state, only evict differs (Dask builds the LRU itself)",
    "worker_with_hooks": "distributed: overriding Worker.get_data and Worker.handle_worker_status_change "
    "(undocumented hooks): the bridge knows when data was last asked of it and when the "
    "scheduler's word of its retirement arrived",
}


# -- dask ------------------------------------------------------------------------------------


def convert_legacy_graph(dsk: dict) -> dict:
    """A tuple-style graph as ``dask.task_spec`` nodes (:data:`FENCED` ``convert_legacy_graph``).

    >>> from operator import add
    >>> sorted(convert_legacy_graph({"a": 1, "b": (add, "a", 1)}))
    ['a', 'b']
    """
    from dask._task_spec import convert_legacy_graph as convert

    return convert(dsk)


def has_expression_layers(expr: Any) -> bool:
    """Whether ``expr`` (a collection's ``.expr``) is a dask-expr expression that lowers and builds
    its layers one expression at a time (:data:`FENCED` ``expression_layer``)."""
    return hasattr(expr, "lower_completely") and hasattr(expr, "_layer")


def expression_layer(expr: Any) -> tuple[str, Callable[[], dict]]:
    """``(name, build)`` of one ``dask.dataframe`` expression: its name and a call building its
    own layer (:data:`FENCED` ``expression_layer``)."""
    return expr._name, expr._layer


# -- distributed: the client -----------------------------------------------------------------


async def future_status_change(fut: Any) -> None:
    """Return once ``fut``'s status may have changed (:data:`FENCED` ``future_status_change``)."""
    await fut._state.wait()


# -- distributed: the scheduler --------------------------------------------------------------


def prefix_duration(scheduler: Any, prefix: Any) -> float:
    """Dask's estimate of a task of ``prefix``'s duration in seconds (:data:`FENCED` ``prefix_duration``)."""
    return scheduler._get_prefix_duration(prefix)


def acquire_replicas(scheduler: Any, worker: str, keys: list, stimulus_id: str) -> None:
    """Ask ``worker`` to fetch ``keys`` now (:data:`FENCED` ``acquire_replicas``)."""
    scheduler.request_acquire_replicas(worker, keys, stimulus_id=stimulus_id)


def move_queued_task(stealing: Any, ts: Any, victim: Any, thief: Any) -> None:
    """Dask's work stealing moves ``ts`` from ``victim`` to ``thief`` (:data:`FENCED` ``move_queued_task``)."""
    stealing.move_task_request(ts, victim, thief)


def bokeh_prefix(app: Any) -> str:
    """The URL prefix a running Bokeh application of the dashboard serves under ('' for none)."""
    return getattr(app, "_prefix", "") or ""


# -- distributed: the worker -----------------------------------------------------------------


def forkserver_preload_ours() -> None:
    """Keep Dask from adding its own forkserver preload (:data:`FENCED` ``forkserver_preload_ours``)."""
    import distributed.utils

    distributed.utils._forkserver_preload_set = True


def forget_run_spec(ts: Any) -> None:
    """Drop a worker task's ``run_spec`` (:data:`FENCED` ``forget_run_spec``)."""
    ts.run_spec = None


def stop_new_tasks(worker: Any) -> None:
    """The worker takes no new task (:data:`FENCED` ``stop_new_tasks``)."""
    from distributed.core import Status

    worker.status = Status.closing_gracefully


def executing_keys(worker: Any) -> set:
    """The keys the worker runs now (:data:`FENCED` ``executing_keys``)."""
    return {ts.key for ts in worker.state.executing}


def refuse_transfers(worker: Any) -> None:
    """The worker answers every request for its data 'busy' (:data:`FENCED` ``refuse_transfers``)."""
    worker.transfer_outgoing_count_limit = 0


def transfers_out(worker: Any) -> int:
    """Transfers from the worker in progress (:data:`FENCED` ``transfers_out``)."""
    return worker.transfer_outgoing_count


def worker_with_hooks(base: type, on_data_asked: Callable[[Any], None],
                      on_status: Callable[[Any, str], None]) -> type:
    """A subclass of the Worker class ``base`` that calls ``on_data_asked(worker)`` when another
    worker or client asks for its data and ``on_status(worker, status)`` when the scheduler sends
    it a status (:data:`FENCED` ``worker_with_hooks``)."""

    class Hooked(base):  # type: ignore[misc, valid-type]
        def handle_worker_status_change(self, status: str, stimulus_id: str) -> None:
            super().handle_worker_status_change(status, stimulus_id)
            on_status(self, status)

        async def get_data(self, comm: Any, keys: Any, who: Any = None, serializers: Any = None) -> Any:
            on_data_asked(self)
            return await super().get_data(comm, keys, who=who, serializers=serializers)

    Hooked.__name__ = Hooked.__qualname__ = base.__name__
    return Hooked


@contextlib.contextmanager
def spill_accounting(data: Any) -> Iterator[None]:
    """While open, evicting one key of ``data`` (a worker's ``SpillBuffer``) is counted and its
    errors handled as Dask's own ``SpillBuffer.evict`` does; nothing is added when ``data`` is
    not Dask's SpillBuffer (:data:`FENCED` ``spill_accounting``)."""
    capture, handle = getattr(data, "_capture_metrics", None), getattr(data, "_handle_errors", None)
    if capture is None or handle is None:
        yield
        return
    with capture(), handle(None):
        yield


# -- zict ------------------------------------------------------------------------------------


def lru_pinned(lru: Any) -> Any:
    """The keys a ``zict.LRU`` must not evict now (:data:`FENCED` ``lru_pinned``)."""
    return getattr(lru, "_cancel_evict", ())


def lru_evict_unlocked(lru: Any, key: Any) -> Any:
    """``zict.LRU.evict(key)`` without its own lock level (:data:`FENCED` ``lru_evict_unlocked``)."""
    import zict

    return zict.LRU.evict.__wrapped__(lru, key)


def turn_lru(lru: Any, cls: type) -> Any:
    """``lru`` (a running worker's ``zict.LRU``), now of class ``cls`` (a subclass of zict.LRU
    adding no state) (:data:`FENCED` ``turn_lru``)."""
    if not isinstance(lru, cls):
        lru.__class__ = cls
    return lru
