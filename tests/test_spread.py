"""Ready tasks where they start first (graph/run/spread.py): the rule, with literal inputs and
hypothesis, and its effect on a real 2-worker LocalCluster."""

from __future__ import annotations

from collections import Counter

import dask
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.run.spread import enabled, place_ready, spread_keys
from pipelines import Pipeline, grid
from tests import spread_steps


def test_ready_siblings_go_where_they_start_first():
    idle = {"a": (0.0, 1), "b": (0.0, 1)}
    four = [(f"m{i}", {"a"}, 1.0) for i in range(4)]
    assert place_ready(four, idle) == {"m1": "b", "m3": "b"}  # a tie stays with the holder (Dask's choice)
    # the holder is busy for 3 s: the first three go to the other worker, the fourth ties
    assert place_ready(four, {"a": (3.0, 1), "b": (0.0, 1)}) == {"m0": "b", "m1": "b", "m2": "b"}
    # threads count: a 2-thread worker takes two for each one of a 1-thread worker
    assert place_ready(four + [("m4", {"a"}, 1.0), ("m5", {"a"}, 1.0)], {"a": (0.0, 1), "b": (0.0, 2)}) == {
        "m1": "b", "m2": "b", "m4": "b", "m5": "b"}


def test_moving_costs_what_dask_says():
    busy_holder = {"a": (1.0, 1), "b": (0.0, 1)}
    assert place_ready([("m", {"a"}, 1.0)], busy_holder, move_cost=lambda t, w: 0.5) == {"m": "b"}
    assert place_ready([("m", {"a"}, 1.0)], busy_holder, move_cost=lambda t, w: 2.0) == {}  # cheaper to wait
    # inputs on both workers: Dask chooses between them itself
    assert place_ready([("m", {"a", "b"}, 1.0)], busy_holder) == {}
    assert place_ready([("m", {"a"}, 1.0)], {"a": (5.0, 1)}) == {}  # one worker


def test_what_the_plugin_may_place_and_the_config():
    from dask.task_spec import Task

    from graph.tasks.iterative import iterative_task

    def fit(x, lr):
        yield {"a": x * lr}

    class Compiled:
        graph = {"a": Task("a", len, [1]), "b": Task("b", len, [2]), "f": iterative_task(Task("f", fit, 2, lr=0.5)),
                 "p": Task("p", len, [3])}
        packed = {"p": ["a"]}
        placement = {}

    assert spread_keys(Compiled) == {"a", "b"}  # training steps and packed tasks are placed elsewhere
    with dask.config.set({"quiver.spread-ready": "no"}):
        with pytest.raises(ValueError, match="quiver.spread-ready"):
            enabled()
    with dask.config.set({"quiver.spread-ready": False}):
        assert enabled() is False


_workers = st.dictionaries(st.sampled_from(["w1", "w2", "w3"]),
                           st.tuples(st.floats(0, 5), st.integers(1, 3)), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(workers=_workers, data=st.data())
def test_place_ready_properties(workers, data):
    names = sorted(workers)
    ready = data.draw(st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=2),
                                         st.frozensets(st.sampled_from(names), min_size=1),
                                         st.floats(0, 3)), max_size=10, unique_by=lambda t: t[0]))
    cost = data.draw(st.floats(0, 2))
    placed = place_ready(ready, workers, move_cost=lambda t, w: cost)
    assert placed == place_ready(ready, workers, move_cost=lambda t, w: cost)  # deterministic
    holders = {t: h for t, h, _ in ready}
    for task, worker in placed.items():
        assert worker in workers and worker not in holders[task]  # only moves, never to a holder
    if len(workers) == 1:
        assert placed == {}
    everywhere = [(t, frozenset(names), s) for t, _, s in ready]
    assert place_ready(everywhere, workers) == {}  # inputs everywhere: Dask's own choice
    # the start-first rule: a moved task could not have started sooner on any holder
    load = {w: work for w, (work, _) in workers.items()}
    threads = {w: n for w, (_, n) in workers.items()}
    for task, held_by, seconds in ready:
        where = placed.get(task)
        if where is not None:
            assert load[where] / threads[where] + cost < min(load[h] / threads[h] for h in held_by)
        else:
            where = min(held_by, key=lambda h: (load[h] / threads[h], h))
        load[where] += seconds


def _siblings(n: int = 4):
    return (Pipeline("spread").source(spread_steps.source, seed=1)
            .explore("a", grid(spread_steps.sibling, a=list(range(n)))))


def test_siblings_start_side_by_side_on_a_real_cluster(client):
    # the four siblings read one input, which one worker computed: Dask alone sends all four
    # there and waits for work stealing; here two of them start at once on the other worker's thread
    r = _siblings().run(client=client, quiet=True, progress=False)
    assert r.stats["spread_tasks"] == 2, r.stats
    workers = Counter(v["worker"] for v in r.values)
    assert sorted(workers.values()) == [2, 2], workers
    first = sorted(r.values, key=lambda v: v["start"])[:2]
    assert first[0]["worker"] != first[1]["worker"]
    assert first[1]["start"] < first[0]["end"]  # side by side, not one after the other
    assert r.stats["executed_tasks"] == 5  # placed, not copied: every step ran once


def test_a_stage_after_a_choose_starts_side_by_side(client):
    # the second stage's four steps read the chosen value, held on one worker when they are
    # submitted: Dask alone queues them all there
    node = (Pipeline("stage").source(spread_steps.source, seed=1)
            .explore("a", grid(spread_steps.sibling, a=[0, 1], seconds=[0.01]))
            .choose("m", k=1, mode="max")
            .explore("b", grid(spread_steps.after, b=list(range(4)))))
    r = node.run(client=client, quiet=True, progress=False)
    assert [v["n"] for v in r.values] == [2.0, 3.0, 4.0, 5.0]
    workers = Counter(v["worker"] for v in r.values)
    assert sorted(workers.values()) == [2, 2], workers
    first = sorted(r.values, key=lambda v: v["start"])[:2]
    assert first[0]["worker"] != first[1]["worker"] and first[1]["start"] < first[0]["end"]
    assert r.stats["spread_tasks"] >= 2, r.stats


def test_no_spread_when_turned_off_or_under_a_budget(client):
    with dask.config.set({"quiver.spread-ready": False}):
        assert _siblings(2).run(client=client, quiet=True, progress=False).stats["spread_tasks"] == 0
    budgeted = _siblings(2).run(client=client, quiet=True, progress=False, memory_budget="8 GiB")
    assert budgeted.stats["spread_tasks"] == 0  # the memory plan counts one copy of each result
