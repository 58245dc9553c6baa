"""Canaries for the fence (graph/_dask.py): one test per entry of ``graph._dask.FENCED``.

Each runs what Quiver relies on against the installed dask / distributed / zict / bokeh, so a
release that changes it fails here, naming the entry, instead of somewhere in a run (issue 50).
"""

from __future__ import annotations

import inspect
import multiprocessing
import threading

import dask
import pytest
import zict
from distributed import Worker
from distributed.utils_test import inc

from graph import _dask as fence

def in_cluster(nthreads: list[int] | None = None, client: bool = True):
    """Run the decorated ``async def test(c, s, *workers)`` on an in-process scheduler and
    workers of its own (not ``gen_cluster``: its leak checks fail on the clusters other tests keep)."""
    import asyncio
    import contextlib
    from distributed import Client, Scheduler

    def wrap(fn):
        def test():
            async def main():
                async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as s, \
                        contextlib.AsyncExitStack() as stack:
                    ws = [await stack.enter_async_context(Worker(s.address, nthreads=n)) for n in (nthreads or [])]
                    async with Client(s.address, asynchronous=True) as c:
                        await asyncio.wait_for(fn(c, s, *ws), 60)

            asyncio.run(main())

        test.__name__ = test.__qualname__ = fn.__name__  # not functools.wraps: pytest would read fn's arguments
        test.__doc__ = fn.__doc__
        return test

    return wrap


_GATE = threading.Event()  # in-process workers (in_cluster): a task waits on it


def _blocked() -> bool:
    return _GATE.wait(30)

def test_every_fenced_use_has_a_canary():
    tested = {name[len("test_canary_"):] for name in globals() if name.startswith("test_canary_")}
    assert set(fence.FENCED) == tested
    assert set(fence.FENCED) <= set(fence.__all__)


def test_canary_convert_legacy_graph():
    from dask.task_spec import DataNode, Task

    out = fence.convert_legacy_graph({"a": 1, "b": (inc, "a")})
    assert isinstance(out["b"], Task) and isinstance(out["a"], DataNode)
    assert out["b"].dependencies == {"a"}


def test_canary_expression_layer():
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    df = dd.from_pandas(pd.DataFrame({"x": range(6)}), npartitions=2)
    expr = (df.x + 1).expr.lower_completely()
    assert fence.has_expression_layers(expr)
    name, build = fence.expression_layer(expr)
    layer = build()
    assert isinstance(name, str) and {k[0] for k in layer} == {name} and len(layer) == 2


def test_canary_forkserver_preload_ours(monkeypatch):
    import distributed.utils

    # the flag Dask's get_mp_context consults before it adds its own forkserver preload
    assert "_forkserver_preload_set" in inspect.getsource(distributed.utils.get_mp_context)
    monkeypatch.setattr(distributed.utils, "_forkserver_preload_set", False)
    fence.forkserver_preload_ours()
    assert distributed.utils._forkserver_preload_set is True
    ctx = multiprocessing.get_context("forkserver")
    asked: list = []
    monkeypatch.setattr(ctx, "set_forkserver_preload", asked.append)
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        distributed.utils.get_mp_context()
    assert asked == []  # Dask added no preload of its own


def test_canary_forget_run_spec():
    from distributed.worker_state_machine import TaskState

    ts = TaskState("x", run_spec=object())
    fence.forget_run_spec(ts)
    assert ts.run_spec is None


@in_cluster([1])
async def test_canary_future_status_change(c, s, a):
    fut = c.submit(inc, 1)
    while fut.status == "pending":
        await fence.future_status_change(fut)
    assert fut.status == "finished"


@in_cluster([1])
async def test_canary_prefix_duration(c, s, a):
    await c.submit(inc, 1, key="inc-1")
    assert isinstance(fence.prefix_duration(s, s.tasks["inc-1"].prefix), float)


@in_cluster([1, 1])
async def test_canary_acquire_replicas(c, s, a, b):
    fut = c.submit(inc, 1, workers=[a.address], key="held")
    await fut
    fence.acquire_replicas(s, b.address, ["held"], stimulus_id="canary")
    while "held" not in b.data:
        await __import__("asyncio").sleep(0.01)
    assert {ws.address for ws in s.tasks["held"].who_has} == {a.address, b.address}


@in_cluster([1, 1])
async def test_canary_move_queued_task(c, s, a, b):
    import asyncio

    _GATE.clear()
    first = c.submit(_blocked, key="busy", workers=[a.address], allow_other_workers=True)
    queued = c.submit(inc, 1, key="queued", workers=[a.address], allow_other_workers=True)
    while len(s.workers[a.address].processing) < 2:
        await asyncio.sleep(0.01)
    stealing = s.extensions["stealing"]
    assert inspect.signature(stealing.move_task_request).parameters.keys() >= {"ts", "victim", "thief"}
    fence.move_queued_task(stealing, s.tasks["queued"], s.workers[a.address], s.workers[b.address])
    assert await queued == 2
    assert "queued" in b.data
    _GATE.set()
    await first


def test_canary_bokeh_prefix():
    from bokeh.server.tornado import BokehTornado

    assert fence.bokeh_prefix(BokehTornado({}, prefix="quiver")).strip("/") == "quiver"


@in_cluster([])
async def test_canary_worker_with_hooks(c, s):
    asked, statuses = [], []
    cls = fence.worker_with_hooks(Worker, lambda w: asked.append(w.address), lambda w, st: statuses.append(st))
    async with cls(s.address, nthreads=1) as w:
        assert await c.submit(inc, 1) == 2  # the client gathers the result from the worker
        assert asked == [w.address]
        await s.retire_workers(workers=[w.address], close_workers=False, remove=False, stimulus_id="canary")
        import asyncio

        while "closing_gracefully" not in statuses:
            await asyncio.sleep(0.01)


@in_cluster([1])
async def test_canary_stop_new_tasks(c, s, a):
    from distributed.core import Status

    fence.stop_new_tasks(a)
    assert a.status == Status.closing_gracefully


@in_cluster([1])
async def test_canary_executing_keys(c, s, a):
    import asyncio

    _GATE.clear()
    fut = c.submit(_blocked, key="running")
    while not fence.executing_keys(a):
        await asyncio.sleep(0.01)
    assert fence.executing_keys(a) == {"running"}
    _GATE.set()
    await fut


@in_cluster([1])
async def test_canary_refuse_transfers(c, s, a):
    fence.refuse_transfers(a)
    assert a.transfer_outgoing_count_limit == 0


@in_cluster([1])
async def test_canary_transfers_out(c, s, a):
    assert fence.transfers_out(a) == 0


def test_canary_spill_accounting(tmp_path):
    from distributed.spill import SpillBuffer

    buf = SpillBuffer(str(tmp_path), target=10**9)
    buf["x"] = b"0" * 1000
    with fence.spill_accounting(buf):
        buf.fast.evict("x")
    assert "x" in buf.slow and "x" not in buf.fast
    assert buf.cumulative_metrics  # Dask's counters saw the write
    with fence.spill_accounting({}):  # not a SpillBuffer: nothing added
        pass


def test_canary_lru_pinned():
    lru = zict.LRU(10, {})
    assert isinstance(fence.lru_pinned(lru), (set, frozenset, dict))


def test_canary_lru_evict_unlocked():
    evicted = []
    lru = zict.LRU(10, {}, on_evict=lambda k, v: evicted.append(k))
    lru["a"], lru["b"] = 1, 2
    with lru.lock:  # as zict's own evict holds it (PlannedLRU.evict is zict.common.locked)
        assert fence.lru_evict_unlocked(lru, "b")[0] == "b"
    assert evicted == ["b"] and "a" in lru and "b" not in lru


def test_canary_turn_lru(tmp_path):
    from distributed.spill import SpillBuffer

    from graph.memory.spill import PlannedLRU

    buf = SpillBuffer(str(tmp_path), target=10**9)
    buf["x"] = 1
    assert type(buf.fast) is zict.LRU  # Dask builds the LRU itself: turned, not replaced
    fast = fence.turn_lru(buf.fast, PlannedLRU)
    assert fast is buf.fast and isinstance(fast, PlannedLRU) and buf["x"] == 1
    buf.fast.evict()
    assert "x" in buf.slow



def test_the_architecture_page_lists_every_fenced_use_with_its_reason():
    """docs/architecture.md §11's table is graph._dask.FENCED (its one owner), row for row."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    section = text[text.index("## 11. The fence"):]
    rows = {line.split("|")[1].strip().strip("`"): line for line in section.splitlines()
            if line.startswith("| `")}
    assert set(rows) == set(fence.FENCED)
    for name, reason in fence.FENCED.items():
        assert reason.split(":", 1)[1].strip() in rows[name], name
