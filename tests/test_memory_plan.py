"""The memory planner as pure logic: small literal explorations, no cluster (cf. dask's test_order.py)."""

from __future__ import annotations

import bisect
import os

import pytest

import graph
from graph import PipelineError
from graph.keys import step_name
from graph.memory.limits import dask_thresholds
from graph.memory.plan import KEEP, RECOMPUTE, SPILL, execution_order, plan_memory
from graph.memory.sizes import SizeEstimates, parse_bytes
from pipelines import Pipeline, grid

MB = 10**6


def load():
    return 0


def step(x, a=0):
    return x


def score(x, a=0):
    return {"score": a}


def finish(x):
    return x


def budget_for(data_bytes: int) -> int:
    """A one-worker budget whose share for results (baseline 0) is ``data_bytes``."""
    return int(data_bytes / dask_thresholds().results_fraction) + 1


def sizes_by_step(c, **by_step):
    return {k: by_step.get(step_name(k), 1) for k in c.graph}


def replay(c, p):
    """Walk the plan's order and check its claims against its own decisions.

    Order: every task after its inputs.  Residency: a ``keep`` result is never evicted, so
    it is in memory from its creation to its last use: at every position the kept results
    alive then fit in the predicted peak, which fits in a worker's share.  Disk: a
    ``spill`` result read again after its eviction is read back from disk (so the plan's
    written and read-back bytes cover those results); a ``recompute`` one is recomputed
    (so the plan counts that many recomputations)."""
    order = p.order
    end = len(order)
    pos = {k: i for i, k in enumerate(order)}
    for t, k in enumerate(order):
        task = c.graph.get(k) or c.metric_graph[k]
        for d in task.dependencies:
            assert pos[d] < t, "a task is planned before its input"
    alive = [0] * (end + 1)
    read_again = {SPILL: 0, RECOMPUTE: 0}
    written = 0
    for k, d in p.decisions.items():
        if d.action == KEEP:
            assert d.evicted_at is None, f"{k} is planned kept but evicted at {d.evicted_at}"
            for t in range(pos[k], max(d.uses, default=pos[k]) + 1):
                alive[t] += d.nbytes
            continue
        assert d.evicted_at is not None and d.evicted_at >= pos[k], f"{k} is {d.action} but never evicted"
        later = [u for u in d.uses if d.evicted_at < u < end]
        if d.action == SPILL:
            written += d.nbytes
            read_again[SPILL] += d.nbytes if later else 0
        else:
            read_again[RECOMPUTE] += 1 if later else 0
    assert max(alive) <= p.predicted_data_peak <= p.worker_data_budget
    assert p.spill_bytes >= written  # each spilled result is written at least once
    assert p.read_bytes >= read_again[SPILL]
    assert p.recomputed >= read_again[RECOMPUTE]


def test_shared_big_intermediate_stays_in_memory_while_branches_read_it():
    # one 60 MB source read by 6 alternatives with 5 MB outputs; room for 80 MB
    node = Pipeline("shared").source(load).explore("a", grid(step, a=list(range(6)))).choose(
        lambda v: 0.0, k=1
    )
    c = graph.compile(node)
    p = plan_memory(
        c,
        budget_for(80 * MB),
        workers=1,
        baseline=0,
        sizes=sizes_by_step(c, load=60 * MB, step=5 * MB),
        seconds={k: 0.001 for k in c.graph},  # cheap steps: recomputing beats a disk round trip
        disk_bandwidth=100 * MB,
    )
    src = next(k for k in c.graph if k.startswith("load"))
    d = p.decisions[src]
    assert len(d.uses) == 6
    # never evicted while branches still read it (afterwards only an undecided choose holds it)
    assert d.evicted_at is None or d.evicted_at > max(d.uses)
    assert p.spill_bytes == 0 and p.recomputed == 0
    # the outputs wait for the choose: what does not fit beside the source is dropped (recomputed
    # only if its branch is kept), not written to disk
    assert p.predicted_data_peak <= 80 * MB
    assert p.count(RECOMPUTE) >= 2
    replay(c, p)


def test_held_results_are_spilled_when_recomputing_costs_more_and_dropped_when_it_is_cheap():
    # eight 20 MB outputs wait for a top-2 choose; a 40 MB source is read by all of them
    node = (
        Pipeline("s")
        .source(load)
        .explore("a", grid(score, a=list(range(8))))
        .choose("score", k=2)
        .then(finish)
    )
    c = graph.compile(node)
    sizes = sizes_by_step(c, load=40 * MB, score=20 * MB, finish=1)
    kept_inputs = [b.key for b in c.chooses[0].inputs[:2]]

    def actions(seconds):
        p = plan_memory(c, budget_for(100 * MB), workers=1, baseline=0, sizes=sizes, seconds=seconds,
                        disk_bandwidth=100 * MB)
        assert p.predicted_data_peak <= p.worker_data_budget
        replay(c, p)
        by_step: dict[str, list[str]] = {}
        for d in p.decisions.values():
            by_step.setdefault(d.step, []).append(d.action)
        return p, by_step

    slow, slow_actions = actions({k: 10.0 for k in c.graph})  # recomputing never pays
    assert RECOMPUTE not in slow_actions["score"] and SPILL in slow_actions["score"]
    assert slow.spill_bytes >= 20 * MB
    # the ones the plan assumes kept (first k) are read after the choose: slow to redo, never dropped
    assert all(slow.decisions[k].action in (KEEP, SPILL) for k in kept_inputs)
    fast, fast_actions = actions({k: 0.001 for k in c.graph})  # recomputing a branch is nearly free
    assert RECOMPUTE in fast_actions["score"]
    assert fast.spill_bytes < slow.spill_bytes


def test_replanning_follows_the_chooses_decisions():
    node = Pipeline("d").source(load).explore("a", grid(score, a=list(range(4)))).choose("score", k=1).then(finish)
    c = graph.compile(node)
    sizes = sizes_by_step(c, load=10 * MB, score=10 * MB, finish=1)
    before = execution_order(c)
    after = execution_order(c, {(0, 0): "drop", (0, 1): "drop", (0, 2): "keep", (0, 3): "drop"})
    finishes = [k for k in c.graph if k.startswith("finish")]
    # before deciding, the plan assumes the first input is kept; afterwards it plans the kept one
    assert [k for k in before.order if k in finishes] == [c.branches[0].key]
    assert [k for k in after.order if k in finishes] == [c.branches[2].key]
    assert not after.hold_until  # decided: nothing is held for dropped branches
    p = plan_memory(c, budget_for(30 * MB), workers=1, baseline=0, sizes=sizes,
                    decided={(0, 0): "drop", (0, 1): "drop", (0, 2): "keep", (0, 3): "drop"})
    assert c.chooses[0].inputs[2].key in p.decisions


def test_furthest_next_use_is_evicted_first():
    # deep chain: load -> a(2) -> b(2) -> c(2); every output 30 MB, room for 100 MB
    node = (
        Pipeline("deep")
        .source(load)
        .explore("a", grid(step, a=[1, 2]))
        .explore("b", grid(step, a=[3, 4]))
        .explore("c", grid(score, a=[5, 6]))
    )
    c = graph.compile(node)
    p = plan_memory(c, budget_for(100 * MB), workers=1, baseline=0, sizes=sizes_by_step(c, load=30 * MB, step=30 * MB, score=30 * MB), disk_bandwidth=1)
    # Belady's property: whenever the plan evicts a key, no key it keeps is needed later than it
    for k, d in p.decisions.items():
        if d.evicted_at is None:
            continue
        t = d.evicted_at
        nxt = d.uses[bisect.bisect_right(d.uses, t)] if bisect.bisect_right(d.uses, t) < len(d.uses) else None
        assert nxt is not None and nxt > t
    assert p.count(SPILL) >= 1
    assert p.predicted_data_peak <= 100 * MB
    assert p.spill_bytes >= 30 * MB and p.read_bytes <= p.spill_bytes
    replay(c, p)


def test_wide_grid_behind_a_choose_drops_the_losers_and_keeps_memory_flat():
    n = 40
    node = Pipeline("wide").source(load).explore("a", grid(score, a=list(range(n)))).choose("score", k=1).then(finish)
    c = graph.compile(node)
    sizes = sizes_by_step(c, load=10 * MB, score=10 * MB, finish=1)
    p = plan_memory(c, budget_for(60 * MB), workers=1, baseline=0, sizes=sizes, seconds={k: 0.01 for k in c.graph})
    assert p.predicted_data_peak <= 60 * MB  # 40 outputs of 10 MB are 400 MB if all were held
    assert p.count(RECOMPUTE) >= n - 6
    assert p.spill_bytes == 0


def test_a_step_bigger_than_a_workers_share_is_refused_naming_step_and_sizes():
    node = Pipeline("big").source(load).size_hint("600 MiB").then(finish)
    c = graph.compile(node)
    with pytest.raises(PipelineError) as e:
        plan_memory(c, "1 GB", workers=2, baseline=100 * MB)
    msg = str(e.value)
    assert "'load'" in msg and "600" in msg and "memory_budget" in msg


def test_budget_below_idle_workers_is_refused():
    c = graph.compile(Pipeline("p").source(load))
    with pytest.raises(PipelineError, match="no room for results"):
        plan_memory(c, "200 MB", workers=2, baseline=150 * MB)


def test_size_hints_measured_sizes_and_siblings():
    node = Pipeline("h").source(load).explore("a", grid(step, a=[1, 2, 3])).size_hint("7 MB")
    c = graph.compile(node)
    steps = [k for k in c.graph if k.startswith("step")]
    assert all(c.size_hints[k] == 7 * MB for k in steps)
    est = SizeEstimates(hints=c.size_hints)
    est.update({steps[0]: 9 * MB})
    assert est.get(steps[0]) == 9 * MB and est.source(steps[0]) == "measured"
    assert est.get(steps[1]) == 7 * MB and est.source(steps[1]) == "hint"
    load_key = next(k for k in c.graph if k.startswith("load"))
    assert est.source(load_key) == "default"


def test_size_hint_errors_are_clear():
    with pytest.raises(PipelineError, match="size_hint"):
        Pipeline("p").source(load).size_hint("lots")
    with pytest.raises(PipelineError, match="choose"):
        Pipeline("p").source(load).explore("a", grid(score, a=[1])).choose("score").size_hint(10)


def test_plan_prints_what_it_decided_and_is_deterministic():
    node = Pipeline("p").source(load).explore("a", grid(score, a=list(range(5)))).choose("score", k=1).then(finish)
    c = graph.compile(node)
    sizes = sizes_by_step(c, load=20 * MB, score=20 * MB, finish=1)
    p1 = plan_memory(c, budget_for(50 * MB), workers=1, baseline=0, sizes=sizes)
    p2 = plan_memory(c, budget_for(50 * MB), workers=1, baseline=0, sizes=sizes)
    assert [(d.key, d.action) for d in p1.decisions.values()] == [(d.key, d.action) for d in p2.decisions.values()]
    text = str(p1)
    assert "predicted peak" in text and "score" in text
    assert any(a in text for a in (KEEP, SPILL, RECOMPUTE))


def test_order_is_depth_first_and_stages_follow_chooses():
    node = Pipeline("p").source(load).explore("a", grid(step, a=[1, 2])).explore("b", grid(score, a=[1, 2])).choose("score", k=1).then(finish)
    c = graph.compile(node)
    sched = execution_order(c)
    order = sched.order
    steps = [step_name(k) for k in order]
    # the first branch's metric arrives before the second "a" alternative starts
    first_metric = next(i for i, k in enumerate(order) if k in c.metric_graph)
    second_a = [i for i, s in enumerate(steps) if s == "step"][1]
    assert first_metric < second_a
    # post-choose work comes after every metric
    last_metric = max(i for i, k in enumerate(order) if k in c.metric_graph)
    assert all(i > last_metric for i, s in enumerate(steps) if s == "finish")


@pytest.mark.slow
def test_deep_chain_plans_without_recursion_error():
    # 3000 steps in a chain, then alternatives too big to hold together behind a choose: evicting
    # one prices recomputing it through the whole chain, and recomputing the kept one replays it
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)  # building and compiling such a chain recurses (graph/spec.py); planning must not
    try:
        node = Pipeline("chain").source(load)
        for i in range(3000):
            node = node.then(step, a=i)
        node = node.explore("m", grid(score, a=[0, 1, 2, 3])).choose("score", k=1).then(finish)
        c = graph.compile(node)
    finally:
        sys.setrecursionlimit(limit)
    sizes = sizes_by_step(c, load=MB, step=MB, score=40 * MB, finish=1)
    p = plan_memory(c, budget_for(70 * MB), workers=1, baseline=0, sizes=sizes, seconds={k: 0.0 for k in c.graph},
                    disk_bandwidth=1e15)
    assert p.count(RECOMPUTE) >= 1
    replay(c, p)


@pytest.mark.parametrize("text,expected", [("2 GiB", 2 * 2**30), ("500MB", 500 * MB), (1234, 1234)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", -5, 0, None, True])
def test_parse_bytes_rejects_nonsense(bad):
    with pytest.raises(ValueError, match="memory budget"):
        parse_bytes(bad)


def test_planned_spill_buffer_evicts_by_plan_on_real_disk(tmp_path):
    from graph.memory.spill import NextUses, PlannedSpillBuffer

    buf = PlannedSpillBuffer(str(tmp_path), target=3000)
    buf.fast.plan = NextUses({"soon": (5,), "mid": (20,), "late": (50,), "new": (30,), "more": (10,)})
    buf["soon"] = b"s" * 1000  # the oldest: what an LRU would evict first
    buf["late"] = b"l" * 1000
    buf["mid"] = b"m" * 900
    buf["new"] = b"n" * 500  # over target: the key needed furthest in the future goes to disk
    assert set(buf.disk) == {"late"}
    buf["more"] = b"x" * 900
    assert set(buf.disk) == {"late", "new"}
    assert {"soon", "mid", "more"} <= set(buf.memory)
    assert os.listdir(tmp_path / "storage")  # really on disk
    assert buf["late"] == b"l" * 1000  # and read back intact
    assert buf.cumulative_metrics[("disk-write", "count")] >= 2


def test_a_plan_that_holds_everything_takes_the_cheap_path_and_a_tight_one_does_not():
    """Issue 24 point 2: ``MemoryPlan.evicts`` is what the run's budget installs a plan for."""
    c = graph.compile(Pipeline("w").source(load).explore("a", grid(step, a=list(range(6)))).then(finish))
    roomy = plan_memory(c, "100 GB", workers=1, baseline=0, sizes=sizes_by_step(c, load=10 * MB, step=10 * MB, finish=10 * MB))
    assert not roomy.evicts and roomy.spill_bytes == 0 and roomy.count(KEEP) == len(roomy.decisions)
    tight = plan_memory(c, budget_for(35 * MB), workers=1, baseline=0,
                        sizes=sizes_by_step(c, load=10 * MB, step=10 * MB, finish=10 * MB))
    assert tight.evicts and tight.count(KEEP) < len(tight.decisions)


def test_the_room_for_results_follows_daskconfig_thresholds():
    import dask

    from graph.memory.limits import Thresholds, data_share

    c = graph.compile(Pipeline("w").source(load).explore("a", grid(step, a=[1, 2])))
    with dask.config.set({"distributed.worker.memory.spill": 0.5}):
        p = plan_memory(c, 1000 * MB, workers=2, baseline=100 * MB)
    assert p.worker_data_budget == 500 * MB * 0.5 - 100 * MB
    assert data_share(1000, workers=2, baseline=100, thresholds=Thresholds(spill=False, pause=0.9)) == 350
    with dask.config.set({"distributed.worker.memory.spill": 7}), pytest.raises(ValueError, match="memory.spill"):
        plan_memory(c, 1000 * MB, workers=2, baseline=100 * MB)
