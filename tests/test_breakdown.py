"""Where a run's time went (graph/breakdown.py, issue 23 point 1): the pure rule on literal and
generated task-stream records, then a real run's ``stats["time_breakdown"]``."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.breakdown import CATEGORIES, breakdown
from pipelines import Pipeline, grid


def rec(key, worker, *spans):
    return {"key": key, "worker": worker, "startstops": [{"action": a, "start": s, "stop": e} for a, s, e in spans]}


def test_overlap_beyond_the_threads_is_scaled_and_unknown_workers_are_left_out():
    records = [rec("a", "w", ("compute", 0.0, 2.0)), rec("b", "w", ("compute", 0.0, 2.0)),
               rec("c", "gone", ("compute", 0.0, 2.0))]
    out = breakdown(records, 0.0, 2.0, {"w": 1})
    assert out["computing"] == pytest.approx(2.0) and out["idle"] == 0.0  # two computes on one thread: scaled to one
    assert sum(out[c] for c in CATEGORIES) == pytest.approx(out["window_s"])


def test_clipped_to_the_window_and_moving_only_charges_free_threads():
    records = [rec("src", "w", ("compute", -5.0, 1.0)),                          # began before the window
               rec("x", "w", ("transfer", 1.0, 3.0), ("compute", 3.0, 9.0))]   # ends after it
    out = breakdown(records, 0.0, 4.0, {"w": 2}, sources={"src"})
    # thread-seconds over 2 threads: loading 1, moving 2 x 2 (both threads free while x's input moves), computing 1
    assert out == pytest.approx({"window_s": 4.0, "threads": 2, "importing": 0.0, "startup": 0.0, "loading": 0.5,
                                 "moving": 2.0, "computing": 0.5, "idle": 1.0})


def test_a_window_that_ends_before_it_starts_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="pass start <= end"):
        breakdown([], 2.0, 1.0, {"w": 1})


span = st.tuples(st.sampled_from(["compute", "transfer", "deserialize", "disk-read"]),
                 st.floats(-2, 12), st.floats(0, 6)).map(lambda t: (t[0], t[1], t[1] + t[2]))
records_st = st.lists(st.tuples(st.sampled_from(["s", "a", "b"]), st.sampled_from(["w1", "w2", "w3"]),
                                st.lists(span, max_size=3)), max_size=25)


@settings(max_examples=150, deadline=None)
@given(records_st, st.dictionaries(st.sampled_from(["w1", "w2"]), st.integers(1, 3), min_size=1),
       st.floats(0, 10), st.floats(0, 10), st.none() | st.tuples(st.floats(-1, 5), st.floats(0, 5)))
def test_the_categories_always_add_up_to_the_window(raw, threads, a, b, imports):
    start, end = min(a, b), max(a, b)
    if imports is not None:
        imports = (imports[0], imports[0] + imports[1])
    out = breakdown([rec(k, w, *spans) for k, w, spans in raw], start, end, threads, sources={"s"}, imports=imports)
    assert all(out[c] >= -1e-9 for c in CATEGORIES)
    assert sum(out[c] for c in CATEGORIES) == pytest.approx(end - start, abs=1e-6)
    # no more compute than the records hold inside the window, per thread
    inside = sum(max(0.0, min(e, end) - max(s, start)) for _, w, spans in raw if w in threads
                 for action, s, e in spans if action == "compute")
    assert out["computing"] + out["loading"] <= inside / sum(threads.values()) + 1e-6


def load():
    time.sleep(0.3)
    return list(range(1000))


def work(data, n):
    time.sleep(0.2 * n)
    return {"score": sum(data) * n}


@pytest.mark.slow
def test_a_real_run_breakdown_adds_up_to_its_wall_time(client):
    result = (Pipeline("breakdown").source(load).explore("w", grid(work, n=[1, 2, 3, 4])).choose("score")
              .run(client, progress=False, quiet=True))
    s = result.stats
    tb = s["time_breakdown"]
    assert tb is not None and tb["threads"] == 2
    total = sum(tb[c] for c in CATEGORIES)
    assert total == pytest.approx(tb["window_s"], rel=0.05)
    # the window is the run (stats["wall_seconds"]) plus the workers' imports before it
    assert s["wall_seconds"] <= tb["window_s"] <= 1.05 * (s["wall_seconds"] + tb["importing"]) + 0.25
    # what the steps slept, in thread-seconds over the 2 threads (sleeps last at least that long),
    # each under its own category; overlaps beyond the threads (a transfer, another run's task
    # on the shared cluster) are scaled down, so the bounds leave room for them
    assert tb["loading"] >= 0.3 / 2 * 0.5
    assert tb["computing"] >= 0.2 * (1 + 2 + 3 + 4) / 2 * 0.5
