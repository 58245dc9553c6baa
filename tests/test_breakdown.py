"""Where a run's time went (graph/report/breakdown.py, issue 23 points 1 and 3): the pure rule on literal and
generated task-stream records and rung waits, then real runs' ``stats["time_breakdown"]``."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.report.breakdown import CATEGORIES, breakdown, wait_spans
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
                                 "moving": 2.0, "computing": 0.5, "waiting": 0.0, "idle": 1.0,
                                 "idle_thread_seconds": 2.0})


def test_a_rung_wait_is_taken_out_of_its_steps_compute_and_idle_is_counted_in_thread_seconds():
    records = [rec("fit-1", "a", ("compute", 0.0, 4.0)), rec("fit-2", "b", ("compute", 0.0, 1.0))]
    # fit-1 waited at two rungs (one of them partly past the window); b's wait beyond its compute is clock jitter
    waits = [("a", 1.0, 1.5), ("a", 3.5, 6.0), ("b", 0.5, 1.5), ("gone", 0.0, 4.0)]
    out = breakdown(records, 0.0, 4.0, {"a": 1, "b": 1}, waits=waits)
    assert out["waiting"] == pytest.approx((0.5 + 0.5 + 0.5) / 2)   # a: 0.5 + 0.5 inside the window, b: 0.5 inside its compute
    assert out["computing"] == pytest.approx((3.0 + 0.5) / 2)
    assert out["idle"] == pytest.approx(3.0 / 2) and out["idle_thread_seconds"] == pytest.approx(3.0)
    assert sum(out[c] for c in CATEGORIES) == pytest.approx(4.0)


def test_wait_spans_keep_this_runs_well_formed_waits():
    msgs = [{"key": "fit~again1", "worker": "a", "spans": [[1.0, 2.0], [3.0, 3.5]]},
            {"key": "other", "worker": "a", "spans": [[0.0, 9.0]]},
            {"key": "fit", "worker": "b", "spans": [["x", 1.0], [2.0]]}, "not a mapping"]
    assert wait_spans(msgs, {"fit"}, key_of=lambda k: k.split("~")[0]) == [("a", 1.0, 2.0), ("a", 3.0, 3.5)]


def test_a_window_that_ends_before_it_starts_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="pass start <= end"):
        breakdown([], 2.0, 1.0, {"w": 1})


span = st.tuples(st.sampled_from(["compute", "transfer", "deserialize", "disk-read"]),
                 st.floats(-2, 12), st.floats(0, 6)).map(lambda t: (t[0], t[1], t[1] + t[2]))
records_st = st.lists(st.tuples(st.sampled_from(["s", "a", "b"]), st.sampled_from(["w1", "w2", "w3"]),
                                st.lists(span, max_size=3)), max_size=25)


waits_st = st.lists(st.tuples(st.sampled_from(["w1", "w2", "w3"]), st.floats(-2, 12), st.floats(0, 4))
                    .map(lambda t: (t[0], t[1], t[1] + t[2])), max_size=6)


@settings(max_examples=150, deadline=None)
@given(records_st, st.dictionaries(st.sampled_from(["w1", "w2"]), st.integers(1, 3), min_size=1),
       st.floats(0, 10), st.floats(0, 10), st.none() | st.tuples(st.floats(-1, 5), st.floats(0, 5)), waits_st)
def test_the_categories_always_add_up_to_the_window(raw, threads, a, b, imports, waits):
    start, end = min(a, b), max(a, b)
    if imports is not None:
        imports = (imports[0], imports[0] + imports[1])
    out = breakdown([rec(k, w, *spans) for k, w, spans in raw], start, end, threads, sources={"s"}, imports=imports,
                    waits=waits)
    without = breakdown([rec(k, w, *spans) for k, w, spans in raw], start, end, threads, sources={"s"},
                        imports=imports)
    # a wait only moves compute into waiting: every other part is unchanged
    assert out["computing"] + out["waiting"] == pytest.approx(without["computing"], abs=1e-6)
    assert all(out[c] == pytest.approx(without[c], abs=1e-6) for c in CATEGORIES if c not in ("computing", "waiting"))
    assert out["idle_thread_seconds"] == pytest.approx(out["idle"] * sum(threads.values()), abs=1e-6)
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


def fit(data, n):
    """A training loop: 4 epochs of 0.15 s, the higher ``n`` the better."""
    for epoch in range(4):
        time.sleep(0.15)
        yield {"score": n * (epoch + 1) + sum(data) * 0}


@pytest.mark.slow
def test_a_pruned_run_shows_its_rung_waits_and_still_adds_up_to_its_wall_time(client):
    from pipelines import halving

    result = (Pipeline("breakdown-rungs").source(load).explore("w", grid(fit, n=[1, 2, 3, 4, 5, 6]))
              .choose("score", prune=halving(factor=3, min_iter=1)).run(client, progress=False, quiet=True))
    s = result.stats
    tb = s["time_breakdown"]
    assert tb is not None and "pruned" in set(result.table["status"])
    assert sum(tb[c] for c in CATEGORIES) == pytest.approx(tb["window_s"], rel=0.05)
    assert s["wall_seconds"] <= tb["window_s"] <= 1.05 * (s["wall_seconds"] + tb["importing"]) + 0.25
    # every rung report waits for the run's answer (a round trip through the scheduler): never nothing
    assert tb["waiting"] > 0
    # the waits are out of the compute: what the loops slept (0.15 s per epoch trained) is computing
    epochs = int(result.table["iterations"].sum())
    assert tb["computing"] >= 0.15 * epochs / 2 * 0.5
    assert tb["computing"] + tb["waiting"] + tb["idle"] + tb["startup"] + tb["loading"] <= tb["window_s"] + 1e-6
    assert tb["idle_thread_seconds"] == pytest.approx(tb["idle"] * tb["threads"])
