"""Memory over time per worker (issue 24 point 4): the thinning rule and the timeline with literal
inputs, the dashboard plugin's samples of a real run on a real LocalCluster (2 worker processes),
and the report's chart of them. The page's panel in a real browser: tests/test_dashboard_browser.py."""

from __future__ import annotations

import json
import math
import time
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.dashboard import QuiverDashboard
from graph.memory.limits import dask_thresholds
from graph.memory.plan import MemoryPlan
from graph.memory.timeline import MemoryTimeline, predicted_worker_peak, thin_indices, worker_series
from pipelines import Pipeline, Result, grid

MIB = 2**20


def hold(v=None, mib=50, i=0):
    """A result of ``mib`` MiB (written, so its pages are really there)."""
    return np.full(mib * MIB // 8, float(i))


def pause_then(v, i, mib, seconds):
    """Sleep ``seconds``, then give a new ``mib`` MiB result (held until the results are gathered)."""
    time.sleep(seconds)
    return hold(mib=mib, i=i)


# ---- the thinning rule, pure ----------------------------------------------------------------------
def test_thinning_keeps_first_last_and_the_maximum():
    peaks = [1, 2, 3, 4, 5, 6, 100, 7, 8, 9, 10]
    keep = thin_indices(peaks, 4)
    assert keep[0] == 0 and keep[-1] == 10 and 6 in keep and len(keep) <= 4
    assert thin_indices([5, 1, 1, 1, 1, 1], 3) == [0, 2, 5]  # the maximum first: one slot for it is enough
    assert thin_indices([1, 1, 1, 1, 1, 9], 3) == [0, 2, 5]
    assert thin_indices([3, 1, 2], 3) == [0, 1, 2]  # fits: all of them
    assert thin_indices([], 3) == []
    with pytest.raises(ValueError, match="give 3 or more"):
        thin_indices([1, 2, 3, 4], 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=400), st.integers(3, 60))
def test_thinning_is_bounded_even_and_keeps_the_ends_and_the_peak(peaks, limit):
    keep = thin_indices(peaks, limit)
    n = len(peaks)
    assert keep == sorted(set(keep)) and len(keep) <= limit
    assert keep[0] == 0 and keep[-1] == n - 1
    assert max(peaks[i] for i in keep) == max(peaks)
    if n <= limit:
        assert keep == list(range(n))
    else:  # evenly spaced: no gap wider than an even spacing over limit - 2 intervals
        assert max(b - a for a, b in zip(keep, keep[1:])) <= math.ceil((n - 1) / (limit - 2))


def test_a_long_run_stays_bounded_and_keeps_its_spike():
    t = MemoryTimeline(limit=2000, pause=0.8, spill=0.7)
    for s in range(10_000):
        managed = 900 * MIB if s == 6_789 else 10 * MIB
        readings = {"tcp://a": (managed, 50 * MIB, 0, 1000 * MIB)}
        if s >= 100:  # a second worker joins later; it is gone for a while
            if not 5_000 <= s < 5_100:
                readings["tcp://b"] = (s, 1, 2, 1000 * MIB)
        t.add(s * 0.5, readings)
    d = json.loads(json.dumps(t.data()))  # plain JSON data
    assert len(d["t"]) <= 2000
    assert d["t"][0] == 0.0 and d["t"][-1] == 9_999 * 0.5
    assert max(d["workers"]["tcp://a"]["managed"]) == 900 * MIB  # the spike survived every thinning
    assert d["workers"]["tcp://b"]["managed"][0] is None  # not there yet: a gap, not a zero
    gone = [m for t_, m in zip(d["t"], d["workers"]["tcp://b"]["managed"]) if 2_500 <= t_ < 2_550]
    assert gone and set(gone) == {None}  # and while it was gone
    gaps = [b - a for a, b in zip(d["t"], d["t"][1:])]
    assert max(gaps) <= 4 * min(gaps[1:-1])  # thinned evenly: old samples no sparser than recent ones
    assert all(len(w[f]) == len(d["t"]) for w in d["workers"].values() for f in ("managed", "unmanaged", "spilled"))
    drawn = worker_series(d, predicted_peak=predicted_worker_peak(1200 * MIB, 2))
    assert [w["name"] for w in drawn] == ["tcp://a", "tcp://b"]
    assert drawn[0]["limit"] == 1000 * MIB and drawn[0]["pause"] == 800 * MIB and drawn[0]["spill"] == 700 * MIB
    assert drawn[0]["predicted"] == [600 * MIB] and math.isnan(drawn[1]["managed"][0])


def test_a_large_cluster_gets_fewer_samples_not_more_memory():
    t = MemoryTimeline(limit=2000, max_readings=50_000)
    readings = {f"tcp://w{i}": (i, 1, 0, 100) for i in range(100)}
    for s in range(3000):
        t.add(float(s), readings)
    d = t.data()
    assert len(d["t"]) * 100 <= 50_000 and d["t"][0] == 0.0 and d["t"][-1] == 2999.0


def test_the_plugin_keeps_the_samples_of_its_newest_runs_only():
    from graph.dashboard.protocol import MAX_MEMORY_RUNS

    plugin = QuiverDashboard()
    for n in range(MAX_MEMORY_RUNS + 2):
        plugin.log_event("quiver-exploration", {"kind": "start", "run": f"r{n}", "branches": []})
        plugin.runs[f"r{n}"]["memory"].add(0.0, {"w": (1, 2, 3, 4)})  # no scheduler here: a sample by hand
    kept = [r for r, run in plugin.runs.items() if plugin.memory_view(run)["timeline"]["t"]]
    assert kept == [f"r{n}" for n in range(2, MAX_MEMORY_RUNS + 2)]


def test_the_limit_comes_into_view_as_memory_nears_it():
    def top(managed_mib, limit_mib, predicted=None):
        d = {"t": [0.0], "pause": 0.8, "workers": {"w": {"limit": limit_mib * MIB, "managed": [managed_mib * MIB],
                                                          "unmanaged": [0], "spilled": [0]}}}
        return worker_series(d, predicted)[0]["y_max"] / MIB

    assert top(100, 12_000) == pytest.approx(105)  # far from the limit: zoomed on the data
    assert top(100, 12_000, predicted=200 * MIB) == pytest.approx(210)  # the plan's line stays in view
    assert top(200, 640) == pytest.approx(640 * 1.05)  # a quarter of the way: the limit and pause line shown
    assert top(700, 640) == pytest.approx(735)  # past the limit (a reading between pauses): the data


def test_bad_limits_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="at least 8"):
        MemoryTimeline(limit=2)
    assert worker_series(None) == [] and worker_series({"t": [0], "workers": {"w": {"managed": []}}}) == []


def test_the_plugin_gives_the_plans_prediction_per_worker():
    plugin = QuiverDashboard()  # no scheduler: no samples, the prediction alone
    plugin.log_event("quiver-exploration", {"kind": "start", "run": "r", "branches": []})
    assert plugin.memory_view(plugin.runs["r"])["predicted_worker_peak"] is None
    plugin.log_event("quiver-exploration", {"kind": "plan", "run": "r", "predicted_peak_bytes": 900, "workers": 3})
    assert plugin.memory_view(plugin.runs["r"])["predicted_worker_peak"] == 300
    plugin.log_event("quiver-exploration", {"kind": "end", "run": "r", "stats": {"predicted_peak_bytes": 1000}})
    assert plugin.memory_view(plugin.runs["r"])["predicted_worker_peak"] == 300  # the plan message says the workers


# ---- a real run on a real cluster --------------------------------------------------------------------
def three_blocks(name="memory-timeline", mib=50):
    p = Pipeline(name).source(hold, mib=1)
    return p.explore("block", grid(pause_then, i=[0, 1, 2], mib=[mib], seconds=[1.0]))


@pytest.mark.slow
def test_samples_of_a_real_run_show_what_its_steps_hold(client, tmp_path):
    result = three_blocks().run(client, progress=False, quiet=True)
    memory = result.stats["worker_memory"]
    json.dumps(memory)  # small and JSON-able
    timeline = memory["timeline"]
    workers = timeline["workers"]
    assert len(workers) == 2 and len(timeline["t"]) >= 4  # the first, the last, and every 0.5 s between
    assert timeline["t"] == sorted(timeline["t"]) and timeline["t"][0] == 0.0
    managed = [sum(w["managed"][i] or 0 for w in workers.values()) for i in range(len(timeline["t"]))]
    # a finished block's 50 MiB result is held while a later block runs for 1 s (a sample every
    # 0.5 s). How many are held at once depends on where Dask ran the blocks: two in parallel
    # after the source ([0, 2, 2, 102, 102, 0] MiB in one clean-clone CI), or the first alone
    # while work stealing was still moving one off the source's worker ([0, 1, 1, 52, 52, 0] in
    # another); the samples show a block held either way
    assert max(managed) - managed[0] >= 50 * MIB, [m // MIB for m in managed]
    for w in workers.values():
        assert w["limit"] and w["limit"] > 0
        assert max(u or 0 for u in w["unmanaged"]) > 10 * MIB  # a Python process with numpy: tens of MiB
        assert all(s == 0 for s in w["spilled"] if s is not None)  # 150 MiB fits: nothing spilled
    assert timeline["pause"] == dask_thresholds().pause and memory["predicted_worker_peak"] is None  # no budget
    # the dashboard's JSON has the same samples for the run
    url = client.dashboard_link.rsplit("/", 1)[0] + "/quiver/api/state.json"
    with urllib.request.urlopen(url, timeout=10) as r:
        runs = json.loads(r.read())["runs"]
    served = [run["memory"] for run in runs if run["name"] == "memory-timeline"][-1]
    assert served["timeline"]["t"][: len(timeline["t"])] == timeline["t"]
    # the report draws it: one panel per worker
    written = result.plot(tmp_path / "report")
    assert written["memory"].read_bytes().startswith(b"\x89PNG") and written["memory"].stat().st_size > 5000
    page = written["html"].read_text()
    assert page.count("data:image/png;base64,") == 1 and 'alt="memory"' in page  # no choose: no metrics figure


def test_the_reports_chart_draws_each_worker_with_its_limits_and_the_plan():
    from pipelines.report import _worker_memory_figure

    data = MemoryTimeline(pause=0.8, spill=0.7)
    for s in range(5):
        data.add(s * 0.5, {"tcp://a": (s * 100 * MIB, 80 * MIB, 0, 640 * MIB), "tcp://b": (0, 80 * MIB, s * MIB, 640 * MIB)})
    plan = MemoryPlan(budget=1280 * MIB, workers=2, baseline=100 * MIB, worker_data_budget=300 * MIB, order=(),
                      decisions={}, predicted_data_peak=400 * MIB, spill_bytes=0, read_bytes=0, recomputed=0)
    import pandas as pd

    table = pd.DataFrame({"status": ["ok"], "seconds": [0.1], "chosen": [True], "error": [None]})
    result = Result(table=table, value=None, values=[], memory_plan=plan,
                    stats={"worker_memory": {"timeline": data.data(), "predicted_worker_peak": None}})
    fig = _worker_memory_figure(result)
    assert [ax.get_title() for ax in fig.axes] == ["worker tcp://a", "worker tcp://b"]
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["spilled", "limit 640 MiB", "Dask pauses 512 MiB", "plan's predicted peak 500 MiB"]
    result.stats["worker_memory"] = None  # a run without samples: no chart
    assert _worker_memory_figure(result) is None


@pytest.mark.slow
def test_a_budgeted_runs_samples_carry_the_plans_prediction_per_worker():
    result = three_blocks(name="budgeted-timeline").run(progress=False, quiet=True, workers=2, memory_budget="1.5 GiB")
    plan, memory = result.memory_plan, result.stats["worker_memory"]
    assert memory["predicted_worker_peak"] == plan.predicted_peak // plan.workers > 0
    assert memory["plan_live"] is True  # the publisher sent each plan as it was made, not only at the end
    workers = memory["timeline"]["workers"]
    assert len(workers) == 2 and {w["limit"] for w in workers.values()} == {plan.worker_memory_limit}
    managed = [sum(w["managed"][i] or 0 for w in workers.values()) for i in range(len(memory["timeline"]["t"]))]
    # the blocks' memory shows (two at once is the unbudgeted test's: the samples every 0.5 s may
    # fall after the first block is let go when a budgeted run's bookkeeping delays the others)
    assert max(managed) - managed[0] >= 50 * MIB, [m // MIB for m in managed]
    # the cluster's total over time is the same samples summed (one sampler, not a second one)
    total = result.stats["memory_timeline"]
    assert [t for t, _, _ in total] == [round(t - memory["timeline"]["t"][0], 3) for t in memory["timeline"]["t"]]
    assert max(p for _, p, _ in total) >= max(managed)
