"""Branch statuses (graph.state.status), with literal inputs: a choose's loser is ``dropped``, a
branch a pruning choose stopped is ``pruned``; every status has one colour, used by the dashboard
and the static report alike; the monitor leaves an iterative step's waits out of its compute."""

from __future__ import annotations

import itertools

from graph.run.monitor import RunMonitor
from graph.state.status import (
    COLORS,
    LIVE_STATUSES,
    STATUSES,
    TABLE_STATUSES,
    branch_status,
    end_status,
    final_status,
)
from graph.report.table import branch_seconds


def test_a_choose_loser_is_dropped_and_a_stopped_step_is_pruned():
    lost = dict(failed=False, decisions=["drop"], ends_at_drop=False, done=False, stopped=False,
                running=False, metric_in=True, aborted=False)
    assert branch_status(**lost) == "dropped"
    assert branch_status(**dict(lost, decisions=[None], stopped=True, metric_in=False)) == "pruned"
    assert branch_status(**dict(lost, ends_at_drop=True)) == "ok"  # it ran to its end
    assert branch_status(**dict(lost, failed=True)) == "failed"


def test_every_status_any_input_gives_has_a_colour_and_a_place():
    seen = set()
    for failed, decision, ends, done, stopped, running, metric_in, aborted in itertools.product(
            (False, True), (None, "keep", "drop", "cancel"), *[(False, True)] * 6):
        live = branch_status(failed, [decision], ends, done, stopped, running, metric_in, aborted)
        assert live in TABLE_STATUSES + LIVE_STATUSES
        table = end_status(live, aborted)
        assert table in TABLE_STATUSES
        for chosen in (False, True):
            shown = final_status(table, chosen)
            seen.add(shown)
            assert shown in STATUSES and shown in COLORS
    assert seen == set(STATUSES) - {"waiting", "running"}
    assert set(COLORS) == set(STATUSES) and len(set(COLORS.values())) == len(COLORS)


def test_an_old_result_that_says_pruned_for_a_choose_loser_still_shows():
    assert final_status("pruned", chosen=False) == "pruned" and "pruned" in COLORS


def test_the_report_and_the_dashboard_use_the_same_colours():
    from graph.dashboard import COLORS as dashboard
    from pipelines import report

    assert dashboard is COLORS and report.COLORS is COLORS


def test_the_monitor_leaves_waits_at_rungs_out_of_a_steps_compute():
    m = RunMonitor("run-1", ["fit", "load"])
    m.log_event("quiver-wait", {"key": "fit", "seconds": 3.0})
    m.log_event("quiver-wait", {"key": "other-run", "seconds": 9.0})  # not this run's: ignored
    m.log_event("quiver-report", {"key": "fit", "seconds": 9.0})  # another topic: ignored
    compute = ({"action": "compute", "start": 0.0, "stop": 4.0},)
    m.transition("fit", "processing", "memory", startstops=compute)
    m.transition("load", "processing", "memory", startstops=compute)
    assert m.snapshot()["seconds"] == {"fit": 1.0, "load": 4.0}


def test_a_shared_task_counts_once_across_the_branches_that_share_it():
    got = branch_seconds([("load", "a"), ("load", "b"), ("load", "b", "c")], {"load": 3.0, "a": 1.0, "b": 2.0, "c": 5.0})
    assert got == [1.0 + 1.0, 1.0 + 1.0, 1.0 + 1.0 + 5.0]
    assert sum(got) == 3.0 + 1.0 + 2.0 + 5.0
