"""Keep / spill / recompute by cost (graph.memory.cost), and results sharing an input's memory
(graph.memory.shared) in the plan and on the workers' spill buffer: pure, no cluster (issue 46)."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from dask.task_spec import Alias, Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.memory.cost import KEEP, RECOMPUTE, SPILL, costs, decide
from graph.memory.plan import plan_memory
from graph.memory.shared import owned_weight, shares_input, views_of
from graph.memory.spill import PlannedLRU, SharedWeight

MB = 10**6
sizes = st.integers(min_value=1, max_value=10**11)
seconds = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)
bandwidths = st.floats(min_value=1e6, max_value=1e10, allow_nan=False)
chances = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


# ------------------------------------------------------------------ the rule, literal costs

def test_literal_costs():
    # a seeded 10 MB chunk regenerated in 20 ms against 2 x 10 MB at 300 MB/s (67 ms): recomputed
    assert decide(10 * MB, 0.020, 300e6) == RECOMPUTE
    # a model's 10 MB of scores that took 2 s: spilled
    assert decide(10 * MB, 2.0, 300e6) == SPILL
    # unknown lineage cost (nothing measured yet): spilled, never run twice on a guess
    assert decide(10 * MB, math.inf, 300e6) == SPILL
    # a tie is spilled (nothing runs twice for no gain)
    c = costs(300 * MB, 2.0, 300e6)
    assert (c.spill, c.recompute, c.cheaper) == (2.0, 2.0, SPILL)
    # a result an undecided choose keeps with chance 1/3: recompute 1/3 of the time, write always
    assert costs(300 * MB, 3.0, 300e6, reads=1 / 3).recompute == pytest.approx(1.0)
    assert decide(300 * MB, 3.0, 300e6, reads=1 / 3) == RECOMPUTE
    with pytest.raises(ValueError):
        costs(1, 1.0, 0)


@settings(max_examples=300, deadline=None)
@given(nbytes=sizes, secs=seconds, bw=bandwidths, p=chances)
def test_cheaper_to_recompute_than_to_move_is_never_spilled(nbytes, secs, bw, p):
    c = costs(nbytes, secs, bw, reads=p)
    if c.recompute < c.spill:
        assert decide(nbytes, secs, bw, reads=p) == RECOMPUTE


@settings(max_examples=300, deadline=None)
@given(nbytes=sizes, secs=seconds, bw=bandwidths, p=chances)
def test_costlier_to_recompute_is_never_dropped_and_nothing_leaves_while_it_fits(nbytes, secs, bw, p):
    c = costs(nbytes, secs, bw, reads=p)
    if c.recompute >= c.spill:
        assert decide(nbytes, secs, bw, reads=p) != RECOMPUTE
    assert decide(nbytes, secs, bw, reads=p, fits=True) == KEEP


# ------------------------------------------------------------------ the rule inside the plan

def _chain(n_parts: int, part: int, step_seconds: dict):
    """A lazy-source-like graph: per partition gen -> cube (a real copy) -> total reads all,
    then a late reader per partition (cube and total): every cube is read twice, across the total."""
    g = {}
    for i in range(n_parts):
        g[("gen", i)] = Task(("gen", i), np.zeros, part)
        g[("cube", i)] = Task(("cube", i), np.square, TaskRef(("gen", i)))
    g["total"] = Task("total", sum, *(TaskRef(("cube", i)) for i in range(n_parts)))
    for i in range(n_parts):
        g[("late", i)] = Task(("late", i), operator.add, TaskRef(("cube", i)), TaskRef("total"))
    sz = {k: part * 8 for k in g if isinstance(k, tuple) and k[0] in ("gen", "cube")}
    sz.update({k: 8 for k in g if k not in sz})
    secs = {k: step_seconds.get(k[0] if isinstance(k, tuple) else k, 0.0) for k in g}
    return g, sz, secs


class _Compiled:
    """The least of a compiled exploration the plan reads: a graph of Dask tasks."""

    def __init__(self, graph, outputs):
        self.graph = graph
        self.metric_graph = {}
        self.size_hints = {}
        self.chooses = []
        self._outputs = outputs


def _plan_graph(graph, sz, secs, capacity):
    """plan_memory's walk on a plain task graph (one worker, baseline 0), through its own classes."""
    from graph.memory.plan import _Belady, _Schedule
    from graph.memory.sizes import SizeEstimates
    from graph.walk import postorder

    order = list(postorder(sorted((k for k in graph if isinstance(k, tuple) and k[0] == "late"), key=str),
                           lambda k: sorted(graph[k].dependencies, key=str, reverse=True), set()))
    sched = _Schedule(order, {k for k in order if isinstance(k, tuple) and k[0] == "late"}, {}, {})
    walk = _Belady(_Compiled(graph, []), sched, SizeEstimates(measured=sz), secs, 300e6, capacity)
    walk.run(lambda *a: None)
    return walk


def test_the_plan_recomputes_cheap_partitions_and_spills_costly_ones():
    part = 1_000_000  # 8 MB partitions, 8 of them; room for 3
    cheap, _, _ = _chain(8, part, {})
    g, sz, secs = _chain(8, part, {"gen": 0.001, "cube": 0.001})
    walk = _plan_graph(g, sz, secs, capacity=3 * part * 8 + 100)
    evicted = {k: a for k, a in walk.action.items() if k[0] == "cube"}
    assert evicted and set(evicted.values()) == {RECOMPUTE}
    g, sz, secs = _chain(8, part, {"gen": 5.0, "cube": 5.0})
    walk = _plan_graph(g, sz, secs, capacity=3 * part * 8 + 100)
    evicted = {k: a for k, a in walk.action.items() if k[0] == "cube"}
    assert evicted and set(evicted.values()) == {SPILL}
    # the same graph with room for all: nothing leaves memory, whatever it costs
    walk = _plan_graph(g, sz, secs, capacity=100 * part * 8)
    assert not walk.action


# ------------------------------------------------------------------ views and aliases

def test_views_and_aliases_are_found_and_copies_are_not():
    g = {
        ("a", 0): Task(("a", 0), np.zeros, 10),
        ("alias", 0): Alias(("alias", 0), ("a", 0)),
        ("cols", 0): Task(("cols", 0), operator.getitem, TaskRef(("alias", 0)), (slice(None), slice(0, 60))),
        ("T", 0): Task(("T", 0), np.transpose, TaskRef(("cols", 0))),
        ("pick", 0): Task(("pick", 0), operator.getitem, TaskRef(("a", 0)), ([1, 2],)),  # fancy: a copy
        ("scalar", 0): Task(("scalar", 0), operator.getitem, TaskRef(("a", 0)), (3,)),  # may be a scalar
        ("sq", 0): Task(("sq", 0), np.square, TaskRef(("a", 0))),
    }
    assert views_of(g) == {("alias", 0): ("a", 0), ("cols", 0): ("a", 0), ("T", 0): ("a", 0)}
    assert shares_input(g[("sq", 0)]) is None


def test_a_view_costs_nothing_in_the_plan_and_keeps_its_owner():
    part = 1_000_000
    g = {}
    for i in range(6):
        g[("gen", i)] = Task(("gen", i), np.zeros, part)
        g[("view", i)] = Task(("view", i), operator.getitem, TaskRef(("gen", i)), (slice(None),))
        g[("late", i)] = Task(("late", i), np.sum, TaskRef(("view", i)))
    sz = {k: part * 8 for k in g if k[0] in ("gen", "view")}
    sz.update({k: 8 for k in g if k[0] == "late"})
    walk = _plan_graph(g, sz, {}, capacity=2 * part * 8 + 100)
    assert walk.views == {("view", i): ("gen", i) for i in range(6)}
    assert walk.tally["spill"] == 0 and not walk.action  # counted as copies, 2x the room: it would spill
    assert walk.tally["peak"] <= 2 * part * 8 + 100


def test_the_workers_spill_buffer_weighs_what_a_result_owns():
    base = np.zeros(1000)
    assert owned_weight("v", base[:600], {"a": base}) == 0
    assert owned_weight("b", base, {"a": base}) == 0  # an alias: the same object
    assert owned_weight("c", base.copy(), {"a": base}) == 8000
    lru = PlannedLRU(20_000, {})
    lru.weight = SharedWeight(lru)
    lru["a"] = base
    lru["alias"] = base
    lru["view"] = base.T
    lru["copy"] = base.copy()
    assert lru.weights["alias"] == lru.weights["view"] == 0
    assert lru.total_weight == lru.weights["a"] + lru.weights["copy"]
    del lru["a"]  # the buffer is still held: one holder carries it over
    assert lru.total_weight == 2 * lru.weights["copy"]
