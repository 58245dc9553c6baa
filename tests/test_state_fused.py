"""Metric reads fused into their step's task (graph.tasks.fusedmetric): the state machine takes the
metric a step sends (``MetricSent``) before or after the step's ``TaskFinished``, counts it
once when the step is computed again, fails a branch with the read's error as the read task
did, and reads with the task after all when no message comes.  Literal events, then random
event orders (tests/test_state.py's pipelines)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph.keys import original_key
from graph.state import (
    ChooseDecided,
    ExplorationState,
    Fail,
    Finished,
    FirstResult,
    Gather,
    MetricRead,
    MetricSent,
    Release,
    Start,
    Submit,
    TaskFinished,
    TaskLost,
    Warn,
    Watch,
)
from pipelines import Pipeline, grid
from tests import steps
from tests.test_state import _pipeline, shapes

ERR = "KeyError: \"choose('x'): the step's output has no key 'x' (keys: ['y'])\""


@pytest.fixture
def fused():
    """source -> add n=1,2 -> choose max x -> mul: each add's task sends its own metric."""
    node = Pipeline("f").source(steps.source).explore("a", grid(steps.add, n=[1, 2])).choose("x").then(steps.mul, n=3)
    c = node.compile()
    cp = c.chooses[0]
    src = cp.inputs[0].lineage[0]
    (add1, add2), (m1, m2) = [b.key for b in cp.inputs], cp.metric_keys
    assert c.fused == {m1: add1, m2: add2}  # the compiler fused both reads
    return c, src, add1, add2, m1, m2


def test_one_task_per_branch_and_the_metric_before_its_step_finishes(fused):
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    out = s.handle(Start())
    assert set(only(out, Submit)[0].tasks) == {src, add1, add2}  # no read tasks
    assert s.handle(TaskFinished(src)) == []
    assert s.handle(MetricSent(m1, add1, 2.0, {"x": 2.0})) == []  # waits for the step's own completion
    assert s.status(0) == "running"
    assert s.handle(TaskFinished(add1)) == [FirstResult()]
    assert s.changes() == ((0, "done", {"x": 2.0}, None), (1, "running", {}, None))
    out = s.handle(MetricSent(m2, add2, 3.0), TaskFinished(add2))
    mul2 = c.branches[1].key
    assert out == [ChooseDecided(0, None, (1,), (0,), ()), Submit({mul2: c.graph[mul2]}, out[1].priority),
                   Release(tuple(sorted((add1, src))))]
    assert s.handle(TaskFinished(mul2)) == [Release((add2,)), Finished()]
    rows = s.rows()
    assert [r.status for r in rows] == ["dropped", "ok"] and rows[0].scalars == {"x": 2.0}
    assert s.submitted == {src, add1, add2, mul2}


def test_the_metric_after_its_step_finished_in_the_same_batch_costs_no_task(fused):
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    s.handle(Start())
    out = s.handle(TaskFinished(src), TaskFinished(add1), MetricSent(m1, add1, 2.0))
    assert out == [FirstResult()] and s.status(0) == "done"


def test_a_metric_that_does_not_come_is_read_by_its_task(fused):
    """A step whose result was on the cluster already (or loaded from a store) sends nothing:
    its read task runs after all, as for an unfused read; a message arriving later is ignored."""
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    s.handle(Start())
    out = s.handle(TaskFinished(src), TaskFinished(add1))
    assert out == [Submit({m1: c.metric_graph[m1]}, out[0].priority)]
    assert s.handle(TaskFinished(m1)) == [Gather((m1,))]
    assert s.handle(MetricRead(m1, 2.0)) == [FirstResult(), Release((m1,))]
    assert s.handle(MetricSent(m1, add1, 9.0)) == [] and s.choose_tip[(0, 0)].metric == 2.0


def test_a_lost_step_after_its_metric_arrived_counts_once(fused):
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    s.handle(Start(), TaskFinished(src))
    assert s.handle(MetricSent(m1, add1, 2.0)) == []
    assert s.handle(TaskLost(add1)) == [Watch((add1,))]  # its worker died before the step's completion
    assert s.handle(MetricSent(m1, add1, 7.0)) == []  # Dask computed it again: the first message counts
    assert s.handle(TaskFinished(add1)) == [FirstResult()]
    assert s.handle(MetricSent(m1, add1, 7.0), TaskFinished(add1)) == []
    assert s.choose_tip[(0, 0)].metric == 2.0 and s.completion[0] == [0] and s.live == 3
    assert s.lost == 1


def test_a_step_recomputed_under_a_new_name_sends_under_it(fused):
    """Messages name the task that ran them: ``~againN`` copies are this run's, other names not."""
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    s.handle(Start(), TaskFinished(src))
    assert s.handle(MetricSent(m1, "add-not-this-runs", 5.0)) == []
    assert m1 not in s.metric_values


def test_a_step_without_the_metric_key_fails_as_the_read_task_did(fused):
    c, src, add1, add2, m1, m2 = fused
    s = ExplorationState(c)
    s.handle(Start(), TaskFinished(src))
    assert s.handle(MetricSent(m1, add1, None, {}, ERR, "Traceback ...")) == []
    assert s.handle(TaskFinished(add1)) == []  # one failure is the branch's own business
    row = s.rows()[0]
    assert row.status == "failed" and row.error == ERR and row.failed_step == "choose('x')"
    out = s.handle(TaskFinished(add2), MetricSent(m2, add2, None, {}, ERR.replace("'y'", "'z'")))
    assert [type(i) for i in out][:1] == [Warn] and isinstance(out[-1], Fail)
    assert "the first 2 branches that reached choose('x') failed for the same reason" in out[-1].message
    assert "the step's output has no key 'x'" in out[-1].message


# ---- random event orders ---------------------------------------------------------------------------------------


def only(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 10**6), how=st.sampled_from(["before", "after", "batch", "never", "mixed"]),
       lose=st.sampled_from([0.0, 0.3]))
def test_random_orders_of_metrics_and_completions_give_the_same_decisions(shape, seed, how, lose):
    """Whatever the order of a step's message and its completion (and a loss between them, a
    message never sent, a message sent twice), the run finishes with the chooses deciding on
    the metrics the steps gave, each metric counted once, and no read task unless a message
    did not come."""
    c = _pipeline(shape)
    rng = random.Random(seed)
    metric_of = {}  # metric key -> the value the step gives (fixed per key: a recompute gives the same)
    s = ExplorationState(c, on_metric_error="continue")
    held: dict[str, object] = {}
    pending: list[str] = []
    done: set[str] = set()
    finished = False
    silent: set[str] = set()  # steps whose messages never come, or come in a later batch than their completion

    def value(mk):
        return metric_of.setdefault(mk, rng.choice([1.0, 2.0, 3.0, float("nan")]))

    def apply(out):
        nonlocal finished
        queue = list(out)
        while queue:
            ins = queue.pop(0)
            if isinstance(ins, Submit):
                for name, task in ins.tasks.items():
                    if name.startswith("metric-"):
                        assert c.fused.get(name) in silent or name not in c.fused, f"{name}: a read task for a metric sent with its step"
                    held[name] = task
                    pending.append(name)
            elif isinstance(ins, Gather):
                queue.extend(s.handle(*(MetricRead(n, value(n)) for n in ins.names)))
            elif isinstance(ins, (Release,)):
                for name in ins.names:
                    held.pop(name, None)
            elif isinstance(ins, Watch):
                pass
            elif isinstance(ins, Finished):
                finished = True
            elif isinstance(ins, Fail):
                raise AssertionError(ins.message)
            elif hasattr(ins, "names"):  # Cancel
                for name in ins.names:
                    held.pop(name, None)
                    if name in pending:
                        pending.remove(name)

    apply(s.handle(Start()))
    for _ in range(3000):
        if finished:
            break
        ready = [n for n in pending if all(d in done for d in held[n].dependencies)]
        assert ready, "the run is stuck"
        name = rng.choice(ready)
        key = original_key(name)
        sent = [MetricSent(mk, name, value(mk)) for mk in c.fused if c.fused[mk] == key]
        mode = rng.choice(["before", "after", "batch", "never"]) if how == "mixed" else how
        if sent and mode == "never":
            silent.add(key)
            sent = []
        if sent and rng.random() < lose:  # the worker dies after the message, before the completion
            apply(s.handle(*sent))
            apply(s.handle(TaskLost(name)))
            mode = "before"  # computed again: the same message again
        pending.remove(name)
        done.add(name)
        if mode == "before":
            apply(s.handle(*sent))
            apply(s.handle(TaskFinished(name)))
        elif mode == "after":
            silent.add(key)  # a completion alone: the read task may run (the message is not waited for)
            apply(s.handle(TaskFinished(name)))
            apply(s.handle(*sent))
        else:
            apply(s.handle(*sent, TaskFinished(name)))
    assert finished and s.finished_run
    for (ci, i), tip in s.choose_tip.items():
        if tip.metric is not None:
            mk = c.chooses[ci].metric_keys[i]
            assert tip.metric == metric_of[mk] or (math.isnan(tip.metric) and math.isnan(metric_of[mk]))
    for ci, order in s.completion.items():
        assert len(order) == len(set(order)), "a choose input counted twice"
    for (ci, i), decision in s.gate.items():
        if decision == "keep":
            assert not math.isnan(s.choose_tip[(ci, i)].metric)
    if how in ("before", "batch"):  # every message came with its step: no read task at all
        assert not any(n.startswith("metric-") for n in s.submitted)


# ---- which reads the compiler fuses (graph.compiling.compiler.fuses_read, reads_for_run) ----------------------------------


def counting(x, n):
    for i in range(n):
        yield {"x": x["x"] + i}


def test_the_compiler_fuses_plain_steps_reads_only_and_keeps_every_read_task():
    from graph.compiling.compiler import reads_for_run
    from graph.tasks.fusedmetric import ReadsMetrics
    from graph.tasks.plainvalues import PlainStep
    from pipelines import halving

    src = Pipeline("which").source(steps.source)
    plain = src.explore("a", grid(steps.add, n=[1, 2]))
    c = plain.choose("x").choose(lambda v: -v["x"]).compile()
    assert len(c.fused) == 4 and set(c.fused) == set(c.metric_graph)  # every read keeps its task (the fallback)
    for cp in c.chooses:
        for b in cp.inputs:
            fn = c.graph[b.key].func
            assert isinstance(fn, ReadsMetrics) and len(fn.reads) == 2  # two chooses read one step: one task
    iterative = src.explore("n", grid(counting, n=[2, 3])).choose("x").compile()
    assert iterative.fused == {} and len(iterative.metric_graph) == 2  # it reports under its own wrapper
    pruned = src.explore("n", grid(counting, n=[2, 3])).choose("x", prune=halving(2)).compile()
    assert pruned.fused == {}
    stored = reads_for_run(c, store="somewhere")
    assert stored.fused == {} and all(isinstance(t.func, PlainStep) for t in stored.graph.values())
    assert reads_for_run(c) is c
