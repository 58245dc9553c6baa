"""The exploration state machine (graph/state) without a cluster: literal event sequences in,
literal instructions out, and hypothesis over random event orders (docs/architecture.md §4)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph.keys import original_key, step_name
from graph.state import (
    Abort,
    Cancel,
    ChooseDecided,
    ExplorationState,
    Fail,
    Finished,
    FirstResult,
    Gather,
    MemoryPlanned,
    MetricRead,
    Release,
    Start,
    Submit,
    TaskFailed,
    TaskFinished,
    TaskLost,
    Warn,
    Watch,
    priority,
    run_order,
    run_targets,
)
from pipelines import Pipeline, grid
from tests import steps


def kinds(instructions):
    return [type(i).__name__ for i in instructions]


def only(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


@pytest.fixture
def simple():
    """source -> add n=1,2 -> choose max x (one of two) -> mul: 2 choose inputs, 2 outputs.
    Its metrics are read by tasks of their own (the path of a collection's metric, and of a
    step whose fused read's message does not come); tests/test_state_fused.py drives the
    fused reads, one task per branch."""
    node = Pipeline("s").source(steps.source).explore("a", grid(steps.add, n=[1, 2])).choose("x").then(steps.mul, n=3)
    return dataclasses.replace(node.compile(), fused={})


def test_a_run_from_start_to_finish_as_literal_events_and_instructions(simple):
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    add1, add2 = c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    mul1, mul2 = c.branches[0].key, c.branches[1].key
    s = ExplorationState(c)

    out = s.handle(Start())
    assert out == [Submit(out[0].tasks, out[0].priority)]
    assert s.changes() == ((0, "running", {}, None), (1, "running", {}, None))
    assert set(out[0].tasks) == {src, add1, add2, m1, m2}  # everything up to the choose, nothing behind it
    assert out[0].priority[m1] > out[0].priority[m2]  # depth-first in declaration order
    assert s.handle(TaskFinished(src)) == []
    assert s.handle(TaskFinished(add1)) == []
    assert s.handle(TaskFinished(m1)) == [Gather((m1,))]
    assert s.handle(MetricRead(m1, 2.0)) == [FirstResult(), Release((m1,))]
    assert s.changes() == ((0, "done", {"x": 2.0}, None),)
    assert s.handle(TaskFinished(add2)) == [Release((src,))]  # nothing else reads the source
    assert s.handle(TaskFinished(m2)) == [Gather((m2,))]
    out = s.handle(MetricRead(m2, 3.0))
    # branch 1 wins: its step behind the choose is submitted, branch 0's inputs are let go
    assert out == [
        ChooseDecided(0, None, (1,), (0,), ()),
        Submit({mul2: c.graph[mul2]}, out[1].priority),
        Release(tuple(sorted((add1, m2)))),
    ]
    assert s.changes() == ((0, "dropped", {"x": 2.0}, None), (1, "running", {"x": 3.0}, None))
    assert s.handle(TaskFinished(mul2)) == [Release((add2,)), Finished()]
    assert s.changes() == ((1, "chosen", {"x": 3.0}, None),)
    assert s.result_names() == {1: mul2}
    rows = s.rows()
    assert [r.status for r in rows] == ["dropped", "ok"] and [r.chosen for r in rows] == [False, True]
    assert s.progress()["best"] == "best x=3"


def test_a_failing_step_fails_its_branch_with_the_failing_step(simple):
    c = simple
    add1 = c.chooses[0].inputs[0].key
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(c.chooses[0].inputs[0].lineage[0]))
    s.handle(TaskFailed(add1, "ValueError: bad", "Traceback ..."))
    assert s.status(0) == "failed" and s.output_tips[0].t.branch.key == c.branches[0].key
    row = s.rows()[0]
    assert row.error == "ValueError: bad" and row.failed_step == step_name(add1) == "add"


def test_the_same_metric_mistake_twice_stops_the_run_by_default(simple):
    c = simple
    src, add1, add2 = c.chooses[0].inputs[0].lineage[0], c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    err = "KeyError: \"choose('x'): the step's output has no key 'x' (keys: ['y'])\""
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src), TaskFinished(add1), TaskFinished(add2))
    assert s.handle(TaskFailed(m1, err)) == [Release((m1,))]  # one failure is the branch's own business
    out = s.handle(TaskFailed(m2, err))
    assert kinds(out) == ["Warn", "Fail"] or kinds(out) == ["Warn", "Cancel", "Fail"]
    assert "no key 'x'" in out[0].message
    fail = out[-1].message
    assert "the first 2 branches that reached choose('x') failed for the same reason" in fail
    assert "the step's output has no key 'x'" in fail and "on_metric_error='continue'" in fail and "--keep-going" in fail
    assert "\n" not in fail and s.finished_run
    assert [r.status for r in s.rows()] == ["failed", "failed"]


def test_the_same_metric_mistake_only_warns_with_continue(simple):
    c = simple
    src, add1, add2 = c.chooses[0].inputs[0].lineage[0], c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    err = "TypeError: choose('x'): metric 'x' must be a real number, got str 'abc'"
    s = ExplorationState(c, on_metric_error="continue")
    s.handle(Start())
    s.handle(TaskFinished(src), TaskFinished(add1), TaskFinished(add2), TaskFailed(m1, err))
    out = s.handle(TaskFailed(m2, err.replace("'abc'", "'def'")))  # the same cause, another value
    assert out[0] == Warn("choose('x'): the first 2 branches failed: the metric 'x' is not a number; going on")
    assert not only(out, Fail)


def test_different_metric_mistakes_do_not_stop_the_run(simple):
    c = simple
    src, add1, add2 = c.chooses[0].inputs[0].lineage[0], c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src), TaskFinished(add1), TaskFinished(add2))
    s.handle(TaskFailed(m1, "TypeError: choose('x'): metric 'x' must be a real number, got str 'a'"))
    out = s.handle(TaskFailed(m2, "KeyError: \"choose('x'): the step's output has no key 'x' (keys: [])\""))
    assert not only(out, Fail) and not only(out, Warn)
    assert s.finished_run and [r.status for r in s.rows()] == ["failed", "failed"]


def test_an_upstream_failure_is_not_a_metric_mistake(simple):
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src))
    out = s.handle(*(TaskFailed(b.key, "ValueError: no") for b in c.chooses[0].inputs))
    assert not only(out, Fail) and [r.failed_step for r in s.rows()] == ["add", "add"]


def test_abort_cancels_what_runs_and_fails_the_run(simple):
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src))
    out = s.handle(Abort("the watchdog saw no progress for 60 s"))
    assert isinstance(out[0], Cancel) and src not in out[0].names and len(out[0].names) == 4
    assert out[-1] == Fail("the watchdog saw no progress for 60 s")
    assert s.handle(TaskFinished(c.chooses[0].inputs[0].key)) == []  # nothing after an abort
    assert [r.status for r in s.rows()] == ["cancelled", "cancelled"]


def test_an_abort_that_blames_a_step_fails_its_branch_and_cancels_the_others(simple):
    """A step too large for its worker (the budget's guard) is that branch's failure, not a cancel."""
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    big = c.chooses[0].inputs[0].key
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src))
    out = s.handle(Abort("step 'add' produced a result of 300 MiB, more than ...", blame=big))
    assert out[-1] == Fail("step 'add' produced a result of 300 MiB, more than ...")
    rows = s.rows()
    assert [r.status for r in rows] == ["failed", "cancelled"]
    assert rows[0].error.startswith("step 'add' produced") and rows[0].failed_step == "add"


def test_a_released_result_needed_again_is_recomputed_under_a_new_name(simple):
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    add1, add2 = c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(TaskFinished(src), TaskFinished(add1), TaskFinished(add2), TaskFinished(m1), TaskFinished(m2))
    # the memory plan drops the choose inputs: released now, recomputed for the branch kept
    out = s.handle(MemoryPlanned(frozenset({add1, add2})))
    assert out == [Release(tuple(sorted((add1, add2))))]  # their metric tasks are done: nothing reads them now
    s.handle(MetricRead(m1, 1.0))
    out = s.handle(MetricRead(m2, 5.0))
    submit = only(out, Submit)[0]
    # the kept branch's input and, released meanwhile, the source it needs, under new names
    assert set(submit.tasks) == {f"{add2}~again1", f"{src}~again2", c.branches[1].key}
    assert submit.tasks[c.branches[1].key].dependencies == {f"{add2}~again1"}
    assert submit.tasks[f"{add2}~again1"].dependencies == {f"{src}~again2"}
    assert original_key(f"{add2}~again1") == add2


def test_a_result_lost_before_its_outcome_was_taken_is_watched_again(simple):
    """The driver records a future's status when its done-callback fires; a result already
    lost with its worker then (``lost``, or ``pending`` again) is a ``TaskLost``: Dask computes
    it again (the run holds it), so the machine asks to watch it again, once per loss, and its
    later ``TaskFinished`` goes on as usual. Late or stale losses are ignored."""
    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    add1 = c.chooses[0].inputs[0].key
    s = ExplorationState(c)
    s.handle(Start())
    assert s.handle(TaskLost(src)) == [Watch((src,))]
    assert s.lost == 1 and src not in s.finished
    assert s.handle(TaskFinished(src)) == []
    assert s.handle(TaskLost(src)) == []  # finished already: a later loss is Dask's to recompute
    assert s.handle(TaskLost("not-submitted")) == []
    m1 = c.chooses[0].metric_keys[0]
    assert s.handle(TaskLost(add1), TaskLost(m1)) == [Watch((add1,)), Watch((m1,))]  # lost again, recomputing
    assert s.lost == 3
    assert s.handle(TaskFinished(add1), TaskFinished(m1)) == [Gather((m1,))]


def test_branch_status_rule_dropped_vs_ok_at_the_choose_that_dropped_it():
    """A branch a choose did not keep, whose remaining steps did not run for it, is dropped (even if another
    branch computed them); a branch that ends at the choose that dropped it is ok."""
    p = Pipeline("p").source(steps.source).explore("a", grid(steps.add, n=[1, 2]))
    ends = p.choose("x").compile()
    s = ExplorationState(ends)
    src = ends.chooses[0].inputs[0].lineage[0]
    s.handle(Start())
    s.handle(*(TaskFinished(k) for k in [src] + [b.key for b in ends.chooses[0].inputs] + ends.chooses[0].metric_keys))
    s.handle(MetricRead(ends.chooses[0].metric_keys[0], 1.0), MetricRead(ends.chooses[0].metric_keys[1], 2.0))
    assert [(r.status, r.chosen) for r in s.rows()] == [("ok", False), ("ok", True)]


# ---- one order for the executor and the memory plan --------------------------------------------------------


def _two_chooses():
    p = Pipeline("p").source(steps.source).explore("a", grid(steps.add, n=[1, 2, 3]))
    first = p.choose("x", k=2).explore("b", grid(steps.mul, n=[1, 2]))
    return first.choose("x").then(steps.square).compile()


def test_the_executor_priorities_and_the_memory_plan_order_come_from_one_order():
    from graph.memory.plan import execution_order

    c = _two_chooses()
    targets = run_targets(c)
    n = len(targets)
    order = run_order(targets)
    # within a stage, run order is priority order (Dask runs higher first)
    for a, b in zip(order, order[1:]):
        if a.stage == b.stage:
            assert priority(a, n) > priority(b, n)
        else:
            assert a.stage < b.stage
    # the plan visits targets in that same order: each target's key appears after the previous one's
    sched = execution_order(c, {(0, i): "keep" for i in range(3)} | {(1, i): "keep" for i in range(6)})
    pos = {k: i for i, k in enumerate(sched.order)}
    seen = [pos[t.key] for t in order if t.key in pos]
    assert seen == sorted(seen)
    # and the state machine submits with exactly these priorities (a fused read: its step's)
    s = ExplorationState(c)
    submit = s.handle(Start())[0]
    for t in targets:
        if t.stage == 0:
            assert submit.priority[c.fused.get(t.key, t.key)] == priority(t, n)


# ---- random event orders ---------------------------------------------------------------------------------------


def _pipeline(shape):
    a, b, k, threshold, per, tail, second = shape
    p = Pipeline("h").source(steps.source).explore("a", grid(steps.add, n=list(range(1, a + 1))))
    if b:
        p = p.explore("b", grid(steps.mul, n=list(range(1, b + 1))))
    node = p.choose("x", k=k, threshold=threshold, per="a" if per and b else None)
    if tail:
        node = node.then(steps.square)
    if second:
        node = node.explore("c", grid(steps.add, n=[5, 6])).choose("x", mode="min")
    return node.compile()


shapes = st.tuples(
    st.integers(1, 3),
    st.integers(0, 2),
    st.sampled_from([None, 1, 2]),
    st.sampled_from([None, 3.0]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 10**6), fail_rate=st.sampled_from([0.0, 0.1, 0.3]), drop=st.booleans())
def test_random_event_orders_keep_the_invariants(shape, seed, fail_rate, drop):
    c = _pipeline(shape)
    rng = random.Random(seed)
    s = ExplorationState(c, on_metric_error="continue")
    held: dict[str, object] = {}  # names the driver holds, with their task
    pending: list[str] = []  # submitted, not yet finished or failed
    done: set[str] = set()
    submitted: list[str] = []
    released_keys: set[str] = set()
    finished = False

    def apply(out):
        nonlocal finished
        queue = list(out)
        while queue:
            ins = queue.pop(0)
            if isinstance(ins, Submit):
                for name, task in ins.tasks.items():
                    assert name not in submitted, f"{name} submitted twice"
                    key = original_key(name)
                    if name != key:  # a recompute copy: only of a key let go
                        assert key in released_keys, name
                    submitted.append(name)
                    held[name] = task
                    pending.append(name)
                    assert set(ins.priority) >= {name}
            elif isinstance(ins, Watch):
                raise AssertionError(f"Watch without a TaskLost: {ins}")
            elif isinstance(ins, Gather):
                reads = []
                for name in ins.names:
                    assert name in held and name in done
                    reads.append(MetricRead(name, rng.choice([1.0, 2.0, 3.0, 4.0, float("nan")])))
                queue.extend(s.handle(*reads))
            elif isinstance(ins, (Release, Cancel)):
                for name in ins.names:
                    assert name in held, f"{name} released but not held"
                    # nothing still waiting to run reads it (a failed result fails its readers anyway)
                    for other in pending:
                        if other in held and other != name and name in done:
                            assert name not in held[other].dependencies, f"{name} released while {other} needs it"
                    del held[name]
                    if name in pending:
                        assert isinstance(ins, Cancel)
                        pending.remove(name)
                    released_keys.add(original_key(name))
            elif isinstance(ins, Finished):
                finished = True
            elif isinstance(ins, Fail):
                raise AssertionError(f"unexpected Fail: {ins.message}")

    apply(s.handle(Start()))
    if drop:
        droppable = frozenset(rng.sample(sorted(c.graph), k=min(2, len(c.graph))))
        apply(s.handle(MemoryPlanned(droppable)))
    for _ in range(2000):
        if finished:
            break
        ready = [n for n in pending if all(d in done for d in held[n].dependencies)]
        assert ready, "the run is stuck: nothing can run and it is not finished"
        name = rng.choice(ready)
        pending.remove(name)
        done.add(name)
        if name.startswith("metric-") or rng.random() >= fail_rate:
            apply(s.handle(TaskFinished(name)))
        else:
            done.discard(name)
            apply(s.handle(TaskFailed(name, "ValueError: random failure")))
            # Dask fails what depends on it too
            for other in list(pending):
                if name in held[other].dependencies:
                    pending.remove(other)
                    apply(s.handle(TaskFailed(other, "ValueError: random failure")))
    assert finished and s.finished_run
    rows = s.rows()
    assert len(rows) == len(c.branches)
    for r in rows:
        assert r.status in ("ok", "failed", "dropped", "cancelled"), r.status
        assert not r.chosen or r.status == "ok"
        assert (r.status == "failed") == (r.error is not None)
    for j, name in s.result_names().items():
        assert name in held, "a kept value was released before the final gather"
    # each choose group kept what ranking.decide says (no more than k)
    for cp in c.chooses:
        if cp.spec.k is not None:
            groups = {}
            for i in range(len(cp.inputs)):
                if s.gate.get((cp.index, i)) == "keep":
                    groups.setdefault(cp.group_of(i), []).append(i)
            assert all(len(v) <= cp.spec.k for v in groups.values())
    # nothing NaN is ever kept
    for (ci, i), decision in s.gate.items():
        if decision == "keep":
            m = s.choose_tip[(ci, i)].metric
            assert m is not None and not math.isnan(m)


def test_cost_per_event_does_not_grow_with_the_branches():
    """The machine never scans every branch on an event: finishing one branch's task touches
    a handful of records whatever the number of branches (counted, not timed)."""
    import graph.state.machine as machine

    def touched(n):
        c = Pipeline("w").source(steps.source).explore("a", grid(steps.add, n=list(range(n)))).choose("x").compile()
        s = ExplorationState(c)
        s.handle(Start())
        s.handle(TaskFinished(c.chooses[0].inputs[0].lineage[0]))
        s.changes()  # what the start touched (every branch: it submitted them all)
        calls = 0
        original = machine.ExplorationState.status

        def counting(self, j):
            nonlocal calls
            calls += 1
            return original(self, j)

        machine.ExplorationState.status = counting
        try:
            k = c.chooses[0].inputs[n // 2].key
            s.handle(TaskFinished(k), TaskFinished(c.chooses[0].metric_keys[n // 2]))
            s.changes()  # what the publisher pulls when due
        finally:
            machine.ExplorationState.status = original
        return calls

    assert touched(50) == touched(500) <= 2


def test_every_handling_is_in_the_story_with_its_stimulus_id_and_a_key_finds_its_own(simple):
    """Issue 45 item 3: events carry a stimulus id; the machine keeps a bounded story a failed
    run's error carries (``RunError.story``)."""
    from graph.state import machine

    c = simple
    add1 = c.chooses[0].inputs[0].key
    s = ExplorationState(c)
    s.handle(Start(), stimulus_id="run-start")
    s.handle(TaskFailed(add1, "ValueError: bad", "tb"), stimulus_id=f"{add1}-erred")
    story = s.story()
    assert [sid for sid, _, _ in story] == ["run-start", f"{add1}-erred"]
    assert "TaskFailed" in story[1][1][0] and add1 in story[1][1][0]
    assert [sid for sid, _, _ in s.story(add1)] == ["run-start", f"{add1}-erred"]  # its Submit, its failure
    assert s.story("no-such-key") == []
    s.handle()  # no stimulus id given: one is made
    assert s.story()[-1][0] == f"settle-{len(story) + 1}"
    assert machine.STORY_LENGTH >= 1000


def test_the_story_is_bounded(simple, monkeypatch):
    from graph.state import machine

    monkeypatch.setattr(machine, "STORY_LENGTH", 3)
    s = ExplorationState(simple)
    for i in range(5):
        s.handle(stimulus_id=f"s{i}")
    assert [sid for sid, _, _ in s.story()] == ["s2", "s3", "s4"]


def test_a_budgeted_run_is_told_when_to_replan_once_per_handling(simple):
    """Issue 45 item 3: re-plans are the machine's instructions (Replan), paced by it: after the
    first result, and once after a handling's choose decisions; none without a budget."""
    from graph.state.events import ChooseDecided, MetricRead, Replan, TaskFinished

    c = simple
    src = c.chooses[0].inputs[0].lineage[0]
    add1, add2 = c.chooses[0].inputs[0].key, c.chooses[0].inputs[1].key
    m1, m2 = c.chooses[0].metric_keys
    for planning in (False, True):
        s = ExplorationState(c)
        s.planning = planning
        s.handle(Start())
        s.handle(TaskFinished(src), TaskFinished(add1), TaskFinished(add2), TaskFinished(m1), TaskFinished(m2))
        out = s.handle(MetricRead(m1, 1.0), MetricRead(m2, 2.0))
        replans = [ins for ins in out if isinstance(ins, Replan)]
        assert any(isinstance(ins, ChooseDecided) for ins in out)
        if not planning:
            assert replans == []
        else:
            assert replans == [Replan("first-result"), Replan("decision")]
            assert out[-1] == Replan("decision")  # after the handling's other instructions
