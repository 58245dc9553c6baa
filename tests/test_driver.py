"""The thin driver of the state machine on a real cluster (graph/run/executor.py): what it tells
the dashboard, and a watchdog's abort from another thread (docs/architecture.md §4)."""

from __future__ import annotations

import queue
import threading

import pytest

from graph.dashboard.protocol import EXPLORATION_TOPIC
from graph.errors import RunError
from graph.run.executor import execute
from graph.tasks.rerun import not_rerunnable
from pipelines import Pipeline, grid
from tests import steps
from graph.parcels import opened

pytestmark = pytest.mark.slow  # runs that lose workers


def _exploration_events(client, since):
    return [msg for _, msg in client.get_events(EXPLORATION_TOPIC)[since:]]


def test_execute_called_inside_an_except_block_reports_no_failure(client):
    """``execute``'s clean-up used to read ``sys.exc_info()``, which inside the caller's
    ``except`` block is the caller's exception: a successful run published a failed end."""
    compiled = Pipeline("exc").source(steps.source).explore("a", grid(steps.add, n=[1, 2])).choose("x").compile()
    since = len(client.get_events(EXPLORATION_TOPIC))
    try:
        raise ValueError("the caller's own error, handled")
    except ValueError:
        record = execute(compiled, client, progress=False)
    assert record.table["chosen"].sum() == 1
    events = _exploration_events(client, since)
    ends = [m for m in events if m.get("kind") == "end"]
    assert len(ends) == 1 and ends[0]["error"] is None
    # updates carry only what the dashboard reads (no dead fields such as tasks_submitted)
    for m in events:
        if m.get("kind") == "update":
            assert set(m) <= {"kind", "run", "branches", "tasks_done"}


def test_a_watchdog_aborts_the_run_from_another_thread(client):
    node = Pipeline("wd").source(steps.source).explore("a", grid(steps.sleep_then, seconds=[3.0, 3.1, 3.2, 3.3]))
    since = len(client.get_events(EXPLORATION_TOPIC))
    timers = []

    def watchdog(driver):
        t = threading.Timer(0.5, driver.abort, args=(RunError("watchdog: no task finished for 0.5 s"),))
        t.start()
        timers.append(t)
        return t  # closed (cancelled) when the run ends

    with pytest.raises(RunError, match="^watchdog: no task finished for 0.5 s$") as info:
        execute(node.choose("x").compile(), client, progress=False, on_driver=watchdog)
    assert set(info.value.table["status"]) == {"cancelled"}
    ends = [m for m in _exploration_events(client, since) if m.get("kind") == "end"]
    assert len(ends) == 1 and ends[0]["error"] == "watchdog: no task finished for 0.5 s"


def test_a_result_lost_after_its_callback_fired_is_still_taken_as_finished():
    """The done-callback records the future's status when it fires. The worker holding the
    result is killed before the driver reads its queue: the future is ``lost``/``pending``
    again by then (Dask recomputes it), and reading the status late used to drop the outcome,
    so the run waited for ever. Now the run finishes and the value comes back."""
    import os
    import signal
    import time

    from distributed import Client, LocalCluster

    from graph.run.executor import ExplorationDriver
    from graph.report.progress import Progress
    from graph.state import ExplorationState, Start

    compiled = Pipeline("lost").source(steps.source).then(steps.sleep_then, seconds=2.0).compile()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cl, Client(cl) as c:
        driver = ExplorationDriver(ExplorationState(compiled), c, Progress(enabled=False))
        driver.apply(driver._handle(Start()))
        key = compiled.branches[0].key
        deadline = time.monotonic() + 60
        while driver.events.qsize() < 2 and time.monotonic() < deadline:  # both callbacks fired, nothing read
            time.sleep(0.05)
        assert driver.events.qsize() == 2
        holder = next(iter(c.who_has([driver.futures[key]]).values()))[0]
        os.kill(c.run(os.getpid, workers=[holder])[holder], signal.SIGKILL)
        while driver.futures[key].status == "finished" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert driver.futures[key].status in ("lost", "pending")  # recomputing (2 s) when the driver reads
        done = threading.Thread(target=driver.run, daemon=True)
        done.start()
        done.join(30)
        assert not done.is_alive(), "the run waits for an outcome it dropped"
        assert driver.state.rows()[0].status == "ok"
        # a step's value travels as a parcel (graph.parcels): opened here, as the run opens it
        assert opened(c.gather(driver.futures[key], direct=False))["path"].endswith("sleep(2.0)")


def test_a_failed_run_leaves_no_run_once_markers_on_the_scheduler(client):
    """``not_rerunnable`` steps set a cluster-wide Event per run; they were cleared on the
    success path only. An aborted run clears them too."""
    def once_markers(dask_scheduler):
        return sorted(str(n) for n in dask_scheduler.extensions["events"]._events if str(n).startswith("quiver-once-"))

    node = Pipeline("once").source(steps.source).explore("a", grid(slow_once, seconds=[2.0, 2.1]))
    assert client.run_on_scheduler(once_markers) == []

    def abort_once_started(driver):
        def watch():
            while not client.run_on_scheduler(once_markers):
                time.sleep(0.05)
            driver.abort(RunError("stopped after a run-once step started"))

        threading.Thread(target=watch, daemon=True).start()

    import time

    with pytest.raises(RunError, match="^stopped after a run-once step started$"):
        execute(node.choose("x").compile(), client, progress=False, on_driver=abort_once_started)
    assert client.run_on_scheduler(once_markers) == []


@not_rerunnable
def slow_once(v, seconds):
    import time

    time.sleep(seconds)
    return {"x": seconds}


@pytest.mark.timeout(60)  # a safety bound: a run that waits for the silent scheduler fails here
def test_publishing_never_waits_for_a_silent_scheduler():
    """``Client.log_event`` waits for the scheduler's answer with no timeout. The publisher
    sends from a thread of its own: while that thread is stuck, updates are kept (the later
    ones replace the earlier) and the run's calls return at once; ``finish`` waits a bounded
    time. (A stand-in client whose ``log_event`` blocks, as a stopped scheduler's does.)"""
    from types import SimpleNamespace

    from graph.dashboard.protocol import MAX_QUEUED, ExplorationPublisher
    from tests.conftest import wait_for

    release = threading.Event()
    sent, callers = [], []
    run_thread = threading.current_thread()

    class SilentClient:
        def log_event(self, topic, msg):
            callers.append(threading.current_thread())
            if threading.current_thread() is run_thread:
                return  # a send on the run's thread would hang the test: recorded, for the assert below
            release.wait()
            sent.append(msg)

    compiled = SimpleNamespace(branches=[object()] * 3)
    pub = ExplorationPublisher(SilentClient(), "r", compiled, naive_tasks=3, unique_tasks=3)
    for i in range(200):
        pub.update([(i % 3, "running", {}, None)], tasks_done=i, force=True)
    pub.finish([], {"wall_seconds": 1.0}, timeout=0.5)
    # the run's calls all returned while the scheduler stayed silent: nothing got through, and the
    # one stuck call is the sender's, never the run's thread (``finish`` gave up on it, as bounded)
    assert not release.is_set() and sent == []
    assert callers and run_thread not in callers
    release.set()  # the scheduler answers again: what was queued goes out, the end last
    wait_for(lambda: sent and sent[-1]["kind"] == "end", timeout=10, what="the end to go out")
    assert 1 <= len(sent) <= MAX_QUEUED + 1 and sent[-1]["kind"] == "end"
    assert run_thread not in callers


def test_every_event_and_instruction_is_produced_and_acted_on_by_the_driver():
    """No dead vocabulary in graph/state: the driver (graph/run/executor.py) feeds every event
    and carries out every instruction."""
    import inspect

    import graph.run.executor as executor
    import graph.state.events as events

    source = inspect.getsource(executor)
    unused = [name for name in events.__all__ if f"{name}(" not in source and f"isinstance(ins, {name})" not in source]
    assert unused == []


def test_a_result_found_lost_by_its_watcher_is_watched_until_dask_has_it_again():
    """The other side of the race: the watcher fires while the result is already ``lost``
    (its worker died). That is a ``TaskLost``; the machine asks to ``Watch`` it again, and the
    driver then waits until Dask has recomputed it, once (Dask keeps a lost future ``lost``
    until then: watching for "not pending" again would spin)."""
    import os
    import signal
    import time

    from distributed import Client, LocalCluster

    from graph.run.executor import ExplorationDriver
    from graph.report.progress import Progress
    from graph.state import ExplorationState, Start

    compiled = Pipeline("lost2").source(steps.source).then(steps.sleep_then, seconds=2.0).compile()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cl, Client(cl) as c:
        driver = ExplorationDriver(ExplorationState(compiled), c, Progress(enabled=False))
        driver.apply(driver._handle(Start()))
        key = compiled.branches[0].key
        deadline = time.monotonic() + 60
        outcomes = []  # the driver's queue holds lists of outcomes (one per turn of the client's loop)
        while len(outcomes) < 2 and time.monotonic() < deadline:
            try:
                outcomes.extend(driver.events.get(timeout=0.05))
            except queue.Empty:
                pass
        holder = next(iter(c.who_has([driver.futures[key]]).values()))[0]
        os.kill(c.run(os.getpid, workers=[holder])[holder], signal.SIGKILL)
        while driver.futures[key].status == "finished" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert driver.futures[key].status == "lost"
        for o in outcomes:  # the source's outcome as it came; the value's watcher fires now, on a lost future
            if o.key != key:
                driver.events.put(o)
        driver._watch([driver.futures[key]])
        done = threading.Thread(target=driver.run, daemon=True)
        done.start()
        done.join(30)
        assert not done.is_alive(), "the run waits for a result Dask recomputed"
        assert driver.state.lost == 1  # one loss, one watch again: no spinning on "lost"
        assert driver.state.rows()[0].status == "ok"


def test_metric_reads_are_batched_in_time(client):
    """A gather through the scheduler per finished metric task cost the scheduler and the
    workers more than the tasks did: reads start at most every READ_INTERVAL seconds (unless
    READ_BATCH metrics wait), one read for what finished meanwhile, and every metric is read.
    (Reads by tasks of their own: a collection's metric, or a fused read whose message did not
    come; ``fused={}`` puts every read on that path.)"""
    import dataclasses

    from graph.run import executor

    drivers = []
    node = Pipeline("reads").source(steps.source).explore("a", grid(steps.add, n=list(range(300)))).choose("x", k=2)
    compiled = dataclasses.replace(node.compile(), fused={})
    result = execute(compiled, client, progress=False, on_driver=drivers.append)
    reads = drivers[0].reads
    assert sum(n for _, n in reads) == 300  # each metric read once
    assert [v["x"] for v in result.values] == [299, 298]
    gaps = [b[0] - a[0] for a, b in zip(reads, reads[1:])]
    assert all(g >= executor.READ_INTERVAL * 0.999 for g, (_, n) in zip(gaps, reads[1:]) if n < executor.READ_BATCH)
