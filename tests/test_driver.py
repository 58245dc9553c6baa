"""The thin driver of the state machine on a real cluster (graph/executor.py): what it tells
the dashboard, and a watchdog's abort from another thread (docs/architecture.md §4)."""

from __future__ import annotations

import threading

import pytest

from graph.dashboard.protocol import EXPLORATION_TOPIC
from graph.errors import RunError
from graph.executor import execute
from pipelines import Pipeline, grid
from tests import steps


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
