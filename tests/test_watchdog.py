"""The watchdog: its decisions from literal observations, and real stuck runs it ends."""

from __future__ import annotations

import re

import pytest

from graph.errors import RunError
from graph.state.watchdog import Observation, Watchdog
from pipelines import Pipeline, grid
from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # slow: runs that stall on purpose


def feed(w, *obs):
    return [w.observe(o) for o in obs]


def test_paused_workers_without_progress_stop_after_the_timeout_naming_memory():
    w = Watchdog(stall_timeout=10)
    out = feed(
        w,
        Observation(t=0, workers=2, paused=0, progress=1),
        Observation(t=5, workers=2, paused=2, progress=3),  # progress: the clock starts again
        Observation(t=14, workers=2, paused=2, progress=3),
        Observation(t=15, workers=2, paused=2, progress=3, memory=(250 * 2**20, 300 * 2**20)),
    )
    assert out[:3] == [None, None, None]
    assert "2 of 2 workers paused by memory" in out[3] and "300.00 MiB" in out[3]
    assert "--memory-budget" in out[3] and "\n" not in out[3]


def test_progress_while_paused_is_not_a_stall():
    w = Watchdog(stall_timeout=10)
    obs = [Observation(t=t, workers=1, paused=1, progress=t // 8) for t in range(0, 100, 2)]
    assert all(v is None for v in feed(w, *obs))


def test_a_long_step_on_running_workers_is_never_stopped():
    w = Watchdog(stall_timeout=10)
    assert all(v is None for v in feed(w, *[Observation(t=t, workers=2, progress=5) for t in range(0, 1000, 5)]))


def test_pausing_must_last_the_whole_timeout():
    w = Watchdog(stall_timeout=10)
    out = feed(
        w,
        Observation(t=0, workers=2, progress=1),
        Observation(t=8, workers=2, paused=1, progress=1),  # no progress for 8 s, paused only now
        Observation(t=12, workers=2, paused=1, progress=1),
        Observation(t=18, workers=2, paused=1, progress=1),
    )
    assert out[:3] == [None, None, None] and "paused by memory" in out[3]


def test_no_workers():
    w = Watchdog(stall_timeout=5, scheduler="the scheduler at tcp://h:1")
    out = feed(w, Observation(t=0, workers=0), Observation(t=4, workers=0), Observation(t=6, workers=0))
    assert out[:2] == [None, None]
    assert "no worker has been connected to the scheduler at tcp://h:1" in out[2] and "dask worker" in out[2]


def test_unrunnable_tasks():
    w = Watchdog(stall_timeout=5)
    out = feed(
        w,
        Observation(t=0, workers=1, unrunnable=2, example="gang-x-rank-1"),
        Observation(t=6, workers=1, unrunnable=2, example="gang-x-rank-1"),
    )
    assert out[0] is None and "2 task(s) (e.g. 'gang-x-rank-1') have waited" in out[1]


def test_silent_scheduler_counts_from_its_last_answer():
    w = Watchdog(stall_timeout=5)
    out = feed(
        w,
        Observation(t=0, workers=1, progress=0),
        Observation(t=3, answered=False),
        Observation(t=4, workers=1, progress=0),  # it answered again: the silence restarts
        Observation(t=8, answered=False),
        Observation(t=9.5, answered=False),
    )
    assert out[:4] == [None] * 4 and "has not answered for 6 s" in out[4]


@pytest.mark.parametrize("bad", [0, -1, "10", None])
def test_bad_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="stall_timeout"):
        Watchdog(stall_timeout=bad)


# ---- real clusters ----------------------------------------------------------------------

def load():
    return 1


def hog(x, mb):
    """Leave ``mb`` MB of memory allocated in the worker process (not a result Dask can spill)."""
    import numpy as np

    import builtins

    keep = getattr(builtins, "_quiver_test_hog", [])
    keep.append(np.ones(mb * 2**20 // 8))
    builtins._quiver_test_hog = keep
    if mb >= 100:
        # stay running until Dask's memory monitor (every 100 ms) has paused the worker: the other
        # branch must not start in between (a branch is one task now, its metric sent with it)
        from distributed import get_worker
        from distributed.core import Status

        from tests.conftest import wait_for

        worker = get_worker()
        wait_for(lambda: worker.status == Status.paused, timeout=30, what="the memory monitor to pause the worker")
    return {"score": float(x)}


def test_workers_paused_by_memory_end_the_run_with_a_clear_error():
    import dask
    from distributed import Client, LocalCluster

    # one worker of 400 MiB: the first branch leaves ~300 MiB that Dask cannot spill, the worker
    # pauses (80%), and the second branch would wait for ever (the nanny's restart at 95% is off,
    # so the worker stays paused, as it does in the report)
    node = Pipeline("pause").source(load).explore("a", grid(hog, mb=[300, 10])).choose("score")
    with dask.config.set({"distributed.worker.memory.terminate": False}), LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", memory_limit="400MiB") as cl, Client(cl) as c:
        with pytest.raises(RunError) as e:
            node.run(c, progress=False, stall_timeout=5)
    msg = str(e.value)
    # ended by the watchdog's paused-by-memory rule once nothing moved for stall_timeout, not before;
    # that it ends at all is bounded by the test's timeout (the worker stays paused for ever)
    assert "paused by memory" in msg and "no task finished or reported for" in msg and "memory budget" in msg
    assert "\n" not in msg
    idle = re.search(r"no task finished or reported for (\d+) s", msg)
    assert idle and int(idle.group(1)) >= 5, msg


def test_a_scheduler_without_workers_ends_the_run_instead_of_waiting():
    from distributed import Client, LocalCluster

    node = Pipeline("none").source(load).explore("a", grid(hog, mb=[0, 1])).choose("score")
    with LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cl, \
            Client(cl) as c:
        with pytest.raises(RunError, match="no worker has been connected .* for [0-9]+ s: the workers died or could not start"):
            node.run(c, progress=False, stall_timeout=3)


def test_reports_are_progress_for_paused_and_unrunnable_but_not_for_a_silent_scheduler():
    """A step that reports is computing: a long first epoch on a paused worker, or branches
    training while a gang waits for workers that are gone, is not a stall; the conditions count
    from the last report, and end the run once the reports stop (graph/run/watchdog.py docs)."""
    w = Watchdog(stall_timeout=10)
    # paused for 40 s, no task finished, a report every 6 s: never stopped
    assert all(v is None for v in feed(w, *[Observation(t=t, paused=1, progress=2, reports=t // 6) for t in range(0, 42, 2)]))
    # the reports stop at t=36 (reports=6): stopped 10 s later, not before
    out = feed(w, Observation(t=44, paused=1, progress=2, reports=6), Observation(t=46, paused=1, progress=2, reports=6))
    assert out == [None, out[1]] and "paused by memory" in out[1] and "no task finished or reported for 10 s" in out[1]
    w = Watchdog(stall_timeout=10)
    obs = [Observation(t=t, unrunnable=2, progress=0, reports=t // 4, example="gang-1") for t in range(0, 40, 2)]
    assert all(v is None for v in feed(w, *obs))
    assert "waited 11 s" in w.observe(Observation(t=47, unrunnable=2, progress=0, reports=9))
    # a silent scheduler: reports are not answers (they flow one way on the workers' streams)
    w = Watchdog(stall_timeout=10)
    out = feed(w, Observation(t=0, reports=1), Observation(t=6, answered=False, reports=2),
               Observation(t=11, answered=False, reports=3))
    assert out[:2] == [None, None] and "has not answered for 11 s" in out[2]


def test_the_same_report_count_is_no_progress():
    w = Watchdog(stall_timeout=10)
    out = feed(w, *[Observation(t=t, paused=1, progress=1, reports=5) for t in (0, 5, 10)])
    assert out[:2] == [None, None] and "paused by memory" in out[2]


def test_an_error_in_the_watchdog_thread_stops_the_run_with_that_error(client):
    """The sampler's thread used to die silently (e.g. "dictionary changed size during
    iteration" reading the machine's live dicts), leaving the run unwatched. Any error there
    now aborts the run, naming it."""
    from graph.run.watchdog import Sampler

    got = []

    def broken():
        raise RuntimeError("dictionary changed size during iteration")

    s = Sampler(client, got.append, stall_timeout=5, progress=broken, interval=0.1).start()
    try:
        wait_for(lambda: got, timeout=20, what="the sampler to report its error")
    finally:
        s.stop()
    assert len(got) == 1 and "\n" not in got[0]
    assert got[0].startswith("the run's watchdog failed (RuntimeError: dictionary changed size during iteration)")


def test_stall_timeout_has_one_meaning_in_execute_and_run(client):
    """``None`` is the default (60 s) and 0 turns the watchdog off, in ``execute()`` as in
    ``run()`` (it used to mean "off" in one and "60 s" in the other)."""
    import threading

    import graph
    from graph.run.executor import execute
    from graph.state.watchdog import DEFAULT_STALL_TIMEOUT, stall_seconds
    from tests import steps

    assert stall_seconds(None) == DEFAULT_STALL_TIMEOUT and stall_seconds(0) is None and stall_seconds(2) == 2.0
    for bad in (-1, True, "10", float("nan")):
        with pytest.raises(ValueError, match="stall_timeout must be seconds"):
            stall_seconds(bad)
    with pytest.raises(graph.PipelineError, match="stall_timeout must be seconds"):
        Pipeline("p").source(steps.source).run(client, progress=False, stall_timeout=-1)
    compiled = Pipeline("p").source(steps.source).compile()
    watched = []
    earlier: set = set()

    def watchdogs() -> set:
        return {t for t in threading.enumerate() if t.name == "quiver-watchdog" and t.is_alive()}

    def note(driver):  # a watchdog this run started (earlier tests' threads may still be ending)
        watched.append(bool(watchdogs() - earlier))

    earlier = watchdogs()
    execute(compiled, client, progress=False, on_driver=note)
    earlier = watchdogs()
    execute(compiled, client, progress=False, on_driver=note, stall_timeout=0)
    assert watched == [True, False]
