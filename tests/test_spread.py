"""Siblings side by side (graph/spread.py): the rule, with literal inputs and hypothesis, and
its effect on a real 2-worker LocalCluster."""

from __future__ import annotations

from collections import Counter

import dask
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.spread import enabled, spread
from pipelines import Pipeline, grid
from tests import spread_steps


def test_a_group_is_dealt_round_robin_in_priority_order():
    deps = {"scale-a": {"src"}, "scale-b": {"src"}, "pca-a": {"scale-a"}, "pca-b": {"scale-a"},
            "pca-c": {"scale-b"}, "fit": {"pca-a", "pca-b"}}
    order = ["scale-a", "pca-a", "pca-b", "scale-b", "pca-c", "fit"]
    assert spread(deps, order, ["w1", "w2"]) == {"scale-a": "w1", "scale-b": "w2", "pca-a": "w1", "pca-b": "w2"}
    # one slot per worker thread: a 2-thread worker gets two of every four
    assert spread({k: {"s"} for k in "abcd"}, list("abcd"), ["x", "x", "y", "y"]) == {
        "a": "x", "b": "x", "c": "y", "d": "y"}


def test_what_is_never_placed():
    assert spread({"a": set(), "b": set()}, ["a", "b"], ["w1", "w2"]) == {}  # no input: Dask spreads them
    assert spread({"a": {"s"}, "b": {"t"}}, ["a", "b"], ["w1", "w2"]) == {}  # no siblings
    assert spread({"a": {"s"}, "b": {"s"}, "c": {"s"}}, ["a", "b", "c"], ["w1", "w2"], skip={"a", "b"}) == {}
    assert spread({"a": {"s"}, "b": {"s"}}, ["a", "b"], ["w1"]) == {}  # one worker thread
    assert spread({"a": {"s"}, "b": {"s"}}, ["a", "b"], []) == {}


def test_the_config_is_checked():
    with dask.config.set({"quiver.spread-siblings": "no"}):
        with pytest.raises(ValueError, match="quiver.spread-siblings"):
            enabled()
    with dask.config.set({"quiver.spread-siblings": False}):
        assert enabled() is False


_keys = st.text("abcdefgh", min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(deps=st.dictionaries(_keys, st.frozensets(st.sampled_from("stuv"), max_size=2), max_size=14),
       slots=st.lists(st.sampled_from(["w1", "w2", "w3"]), min_size=0, max_size=5),
       skip=st.frozensets(_keys, max_size=4), data=st.data())
def test_spread_properties(deps, slots, skip, data):
    order = data.draw(st.permutations(sorted(deps)))
    placed = spread(deps, order, slots, skip=skip)
    assert placed == spread(deps, order, slots, skip=skip)  # deterministic
    if len(slots) < 2:
        assert placed == {}
        return
    for key, worker in placed.items():
        assert worker in slots and key not in skip and deps[key]
        assert sum(1 for k, d in deps.items() if d == deps[key] and k not in skip) >= 2  # a sibling
    # every sibling group (two or more not skipped) is placed whole
    groups = Counter(frozenset(d) for k, d in deps.items() if d and k not in skip)
    assert set(placed) == {k for k, d in deps.items() if d and k not in skip and groups[frozenset(d)] >= 2}
    # the slots are used in turn over the whole submission, as if one list were dealt
    assert Counter(placed.values()) == Counter(slots[i % len(slots)] for i in range(len(placed)))


def _siblings(n: int = 4):
    return (Pipeline("spread").source(spread_steps.source, seed=1)
            .explore("a", grid(spread_steps.sibling, a=list(range(n)))))


def test_siblings_start_side_by_side_on_a_real_cluster(client):
    # the four siblings read one input, which one worker computed: Dask alone sends all four
    # there and waits for work stealing; spread, two start at once, one on each worker
    r = _siblings().run(client=client, quiet=True, progress=False)
    assert r.stats["spread_tasks"] == 4, r.stats
    workers = Counter(v["worker"] for v in r.values)
    assert sorted(workers.values()) == [2, 2], workers
    first = sorted(r.values, key=lambda v: v["start"])[:2]
    assert first[0]["worker"] != first[1]["worker"]
    assert first[1]["start"] < first[0]["end"]  # side by side, not one after the other
    assert r.stats["executed_tasks"] == 5  # placed, not copied: every step ran once


def test_no_spread_when_turned_off_or_under_a_budget(client):
    with dask.config.set({"quiver.spread-siblings": False}):
        assert _siblings(2).run(client=client, quiet=True, progress=False).stats["spread_tasks"] == 0
    budgeted = _siblings(2).run(client=client, quiet=True, progress=False, memory_budget="8 GiB")
    assert budgeted.stats["spread_tasks"] == 0  # the memory plan counts one copy of each result
