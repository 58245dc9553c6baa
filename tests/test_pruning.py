"""Pruning chooses: ``halving`` and ``choose(prune=)`` at build time, and the pure ASHA rule
(``graph.state.halving.Halving``) against a literal transcription of docs/architecture.md §7."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graph
from graph.state.halving import Continue, Halving, Stop
from graph.spec import PruneSpec
from pipelines import Pipeline, PipelineError, grid, halving

ROOT = Path(__file__).resolve().parent.parent


# ---- steps ---------------------------------------------------------------------------------
def load():
    return 1.0


def fit(x, lr, epochs=3):
    for epoch in range(epochs):
        yield {"accuracy": x * lr * (epoch + 1)}
    return {"accuracy": x * lr * epochs}


def fit_scaled(scale, x, lr):
    yield {"accuracy": scale * x * lr}


def plain(x, lr):
    return {"accuracy": x * lr}


def evaluate(v):
    return v


def runs():
    return Pipeline("p").source(load)


# ---- building -------------------------------------------------------------------------------
def test_halving_is_a_plain_value_carried_to_the_compiled_choose():
    best = runs().explore("fit", grid(fit, lr=[0.1, 0.2])).choose("accuracy", prune=halving(factor=2, max_iter=9))
    assert best.spec.prune == PruneSpec(2, 1, 9)
    assert graph.compile(best).chooses[0].spec.prune == PruneSpec(2, 1, 9)
    assert halving() == PruneSpec(3, 1, None)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"factor": 1}, "factor must be a whole number >= 2"),
        ({"factor": 2.5}, "factor must be a whole number >= 2"),
        ({"factor": True}, "factor must be a whole number >= 2"),
        ({"min_iter": 0}, "min_iter must be a whole number >= 1"),
        ({"min_iter": "1"}, "min_iter must be a whole number >= 1"),
        ({"min_iter": 3, "max_iter": 2}, "max_iter must be None (no cap) or a whole number >= min_iter (3)"),
        ({"max_iter": 4.0}, "max_iter must be None"),
    ],
)
def test_bad_halving_arguments_are_refused_when_built(kwargs, says):
    with pytest.raises(PipelineError) as err:
        halving(**kwargs)
    assert says in str(err.value) and "e.g. halving(" in str(err.value)


@pytest.mark.parametrize("bad", [3, "halving", {"factor": 3}, halving])
def test_prune_must_be_a_halving_rule(bad):
    node = runs().explore("fit", grid(fit, lr=[0.1, 0.2]))
    with pytest.raises(PipelineError, match=r"choose\('accuracy'\): prune= takes the rule pipelines.halving"):
        node.choose("accuracy", prune=bad)


def test_prune_on_steps_that_do_not_iterate_is_refused_and_names_them():
    node = runs().explore("fit", grid(fit, lr=[0.1]), grid(plain, lr=[0.1]))
    with pytest.raises(PipelineError) as err:
        node.choose("accuracy", prune=halving())
    msg = str(err.value)
    assert "must be iterative" in msg and "plain is not" in msg and "fit" not in msg.split("; ")[1]
    # a plain step after the iterative one: the choose reads the plain step's value
    with pytest.raises(PipelineError, match="evaluate is not"):
        runs().explore("fit", grid(fit, lr=[0.1])).then(evaluate).choose("accuracy", prune=halving())


def test_generator_steps_through_partial_and_after_a_choose_are_iterative():
    scaled = functools.partial(fit_scaled, 2.0)  # positional: stays a partial in the spec
    node = runs().explore("fit", a=functools.partial(fit, lr=0.1), b=functools.partial(scaled, lr=0.2))
    assert isinstance(node.spec.alternatives[1].call.fn, functools.partial)
    assert node.choose("accuracy", prune=halving()).spec.prune is not None
    chosen = runs().explore("fit", grid(fit, lr=[0.1, 0.2])).choose("accuracy", k=2)
    assert chosen.choose("accuracy", prune=halving()).spec.prune is not None


def test_gpu_train_is_an_iterative_step():
    import gpu

    from graph.tasks.iterative import is_iterative

    assert is_iterative(gpu.train) and not is_iterative(plain)


def test_generator_step_keys_are_deterministic_across_processes():
    node = runs().explore("fit", grid(fit, lr=[0.1, 0.2])).choose("accuracy", prune=halving())
    keys = sorted(graph.compile(node).graph)
    assert keys == sorted(graph.compile(node).graph) and any(k.startswith("fit-") for k in keys)
    code = (
        "import graph; from tests.test_pruning import runs, fit, grid, halving;"
        "print(sorted(graph.compile(runs().explore('fit', grid(fit, lr=[0.1, 0.2]))"
        ".choose('accuracy', prune=halving())).graph))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(keys)


# ---- the rule: a literal transcription ------------------------------------------------------
def literal(prune: PruneSpec, mode: str, reports: list[tuple]) -> list:
    """docs/architecture.md §7 read word by word, recomputed from scratch for every report.

    ``reports``: (branch, group, iteration, metric) in arrival order.  A report of a
    (branch, iteration) already answered gets that answer; a branch already stopped gets
    its stop; at a rung the branch continues iff it is within the top max(1, n // factor)
    of the n branches of its group that reached the rung so far (itself included; better
    metric first, ties to the lower branch index, NaN last and never continuing)."""
    answers: list = []
    for t, (b, g, i, m) in enumerate(reports):
        earlier = [a for a, (b2, _, i2, _) in zip(answers, reports[:t]) if (b2, i2) == (b, i)]
        stops = [a for a, (b2, *_) in zip(answers, reports[:t]) if b2 == b and isinstance(a, Stop)]
        if earlier:
            answers.append(earlier[0])
            continue
        if stops:
            answers.append(stops[0])
            continue
        rungs = [prune.min_iter * prune.factor**r for r in range(64)]
        is_rung = i in rungs and (prune.max_iter is None or i < prune.max_iter)
        if is_rung:
            # branches of group g that reached rung i before (first arrival, while not stopped)
            at_rung = {}
            for a, (b2, g2, i2, m2), tt in zip(answers, reports[:t], range(t)):
                if g2 == g and i2 == i and b2 not in at_rung:
                    stopped_before = any(
                        isinstance(answers[s], Stop) and reports[s][0] == b2 for s in range(tt)
                    )
                    if not stopped_before:
                        at_rung[b2] = m2
            at_rung[b] = m
            n = len(at_rung)

            def better(x, y):  # x ranks before y
                (bx, mx), (by, my) = x, y
                if math.isnan(mx) != math.isnan(my):
                    return math.isnan(my)
                if not math.isnan(mx) and mx != my:
                    return mx > my if mode == "max" else mx < my
                return bx < by

            rank = sum(1 for other in at_rung.items() if other[0] != b and better(other, (b, m)))
            if rank >= max(1, n // prune.factor) or math.isnan(m):
                answers.append(Stop(rungs.index(i), i))
                continue
        if prune.max_iter is not None and i >= prune.max_iter:
            answers.append(Stop(None, i))
            continue
        answers.append(Continue())
    return answers


def decide(prune, mode, reports):
    h = Halving(prune, mode)
    return [h.report(*r) for r in reports]


C = Continue()


def test_one_rung_with_ties_going_to_the_branch_declared_first():
    reports = [(b, None, 1, m) for b, m in enumerate([0.5, 0.6, 0.4, 0.9, 0.6, 0.1])]
    # n: 1 2 3 4 5 6 -> top 1 1 1 1 1 2 ; branch 4 ties branch 1 (0.6) and loses the tie
    expected = [C, C, Stop(0, 1), C, Stop(0, 1), Stop(0, 1)]
    assert decide(PruneSpec(3, 1), "max", reports) == expected == literal(PruneSpec(3, 1), "max", reports)


def test_min_mode_nan_and_late_arrivals_across_rungs():
    p = PruneSpec(2, 1)  # rungs at 1, 2, 4, 8
    reports = [
        (0, None, 1, 0.3),  # n=1 -> continue
        (1, None, 1, float("nan")),  # NaN never continues
        (0, None, 2, 0.2),  # first at rung 2: continue
        (2, None, 1, 0.1),  # n=3 (NaN included), top 1: 0.1 is best -> continue
        (0, None, 3, 0.2),  # not a rung
        (3, None, 1, 0.2),  # n=4, top 2: 0.1, 0.2 -> continue
        (2, None, 2, 0.25),  # rung 2, n=2, top 1: 0.2 (branch 0) is better -> stop
        (4, None, 1, 0.15),  # late arrival at rung 1: n=5, top 2: 0.1, 0.15 -> continue
        (3, None, 2, 0.1),  # rung 2, n=3, top 1: 0.1 beats 0.2 -> continue
    ]
    expected = [C, Stop(0, 1), C, C, C, C, Stop(1, 2), C, C]
    assert decide(p, "min", reports) == expected == literal(p, "min", reports)


def test_groups_halve_separately():
    p = PruneSpec(2, 1)
    reports = [(0, "a", 1, 0.9), (1, "b", 1, 0.1), (2, "a", 1, 0.5), (3, "b", 1, 0.2)]
    # "b": branch 1 is first in its group whatever "a" holds; branch 3 beats it there
    expected = [C, C, Stop(0, 1), C]
    assert decide(p, "max", reports) == expected == literal(p, "max", reports)


def test_replays_are_answered_again_without_counting_twice():
    p = PruneSpec(3, 1)
    first = [(0, None, 1, 0.5), (1, None, 1, 0.4), (0, None, 2, 0.6)]
    replay = [(1, None, 1, 0.4), (0, None, 1, 0.5), (0, None, 2, 0.6)]  # branch 0 and 1 restarted
    late = [(2, None, 1, 0.45), (3, None, 1, 0.3), (4, None, 1, 0.8)]
    reports = first + replay + late
    # n at rung 1 for the late ones is 3, 4, 5 (not 5, 6, 7): replays were not counted
    expected = [C, Stop(0, 1), C, Stop(0, 1), C, C, Stop(0, 1), Stop(0, 1), C]
    assert decide(p, "max", reports) == expected == literal(p, "max", reports)
    h = Halving(p)
    for r in reports:
        h.report(*r)
    assert [e.n for e in h.arrivals[(None, 0)]] == [1, 2, 3, 4, 5]


def test_a_failed_branch_never_blocks_and_a_stopped_branch_is_not_ranked_again():
    p = PruneSpec(2, 1)
    reports = [
        (0, None, 1, 0.9),
        (1, None, 1, 0.8),  # stopped at rung 1 ...
        (1, None, 2, 0.99),  # ... a report in flight before the stop reached it: same stop, not ranked
        (2, None, 1, 0.95),  # n=3, top 1: best -> continue (branch 0 then fails: nothing waits for it)
        (2, None, 2, 0.2),  # rung 2: branch 1's 0.99 is not there, branch 2 is first -> continue
    ]
    expected = [C, Stop(0, 1), Stop(0, 1), C, C]
    assert decide(p, "max", reports) == expected == literal(p, "max", reports)


def test_max_iter_caps_without_pruning():
    p = PruneSpec(2, 1, 4)  # rungs at 1, 2; at 4 reports a branch has finished
    reports = [(0, None, 1, 1.0), (0, None, 2, 1.0), (0, None, 3, 1.0), (0, None, 4, 1.0), (1, None, 4, 0.0)]
    expected = [C, C, C, Stop(None, 4), Stop(None, 4)]
    assert decide(p, "max", reports) == expected == literal(p, "max", reports)
    assert not Stop(None, 4).pruned and Stop(0, 1).pruned
    # a rung at max_iter is no rung: PruneSpec(3, 1, 9) has rungs 1 and 3 only
    assert PruneSpec(3, 1, 9).rungs(100) == (1, 3)


# ---- hypothesis: random curves, random arrival orders, replays -------------------------------
@st.composite
def scenarios(draw):
    factor = draw(st.integers(2, 4))
    min_iter = draw(st.integers(1, 3))
    max_iter = draw(st.one_of(st.none(), st.integers(min_iter, 30)))
    n = draw(st.integers(1, 9))
    groups = draw(st.lists(st.sampled_from(["a", "b"]), min_size=n, max_size=n))
    metric = st.one_of(st.sampled_from([0.0, 0.5, 1.0, float("nan")]), st.floats(-2, 2))
    curves = [draw(st.lists(metric, min_size=1, max_size=12)) for _ in range(n)]
    order = draw(st.permutations([b for b in range(n) for _ in curves[b]]))
    replays = draw(st.lists(st.integers(0, len(order)), max_size=4))
    return PruneSpec(factor, min_iter, max_iter), draw(st.sampled_from(["max", "min"])), groups, curves, order, replays


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_halving_matches_the_literal_rule(scenario):
    prune, mode, groups, curves, order, replays = scenario
    h = Halving(prune, mode)
    made = [0] * len(curves)
    reports: list[tuple] = []
    answers: list = []
    for t, b in enumerate(order):
        if t in replays and made[b]:  # a restart of b: its reports come again, in order
            for i in range(1, made[b] + 1):
                reports.append((b, groups[b], i, curves[b][i - 1]))
                answers.append(h.report(*reports[-1]))
        if h.stopped(b) is not None:  # the run stopped it: it reports no more
            continue
        made[b] += 1
        reports.append((b, groups[b], made[b], curves[b][made[b] - 1]))
        answers.append(h.report(*reports[-1]))
    assert answers == literal(prune, mode, reports)
    for entries in h.arrivals.values():
        assert len({e.branch for e in entries}) == len(entries)  # never counted twice at a rung
        assert [e.n for e in entries] == list(range(1, len(entries) + 1))
        assert entries[0].continued or math.isnan(entries[0].metric)  # the first there never waits


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 4), st.sampled_from(["max", "min"]),
       st.lists(st.one_of(st.sampled_from([0.0, 0.5, float("nan")]), st.floats(-2, 2)), min_size=1, max_size=10),
       st.integers(0, 10))
def test_reports_that_arrive_together_are_ranked_against_each_other(factor, mode, metrics, before):
    # branches 0..before-1 arrive one at a time, the rest together (a packed task's epoch): each of
    # the batch is judged against every branch at the rung, its batch-mates included
    before = min(before, len(metrics))
    h = Halving(PruneSpec(factor, 1), mode)
    one_by_one = [h.report(b, None, 1, m) for b, m in enumerate(metrics[:before])]
    batch = h.report_many([(b, None, 1, m) for b, m in enumerate(metrics) if b >= before])
    assert one_by_one == literal(PruneSpec(factor, 1), mode, [(b, None, 1, m) for b, m in enumerate(metrics[:before])])
    n = len(metrics)
    ranked = sorted(range(n), key=lambda b: (math.isnan(metrics[b]), 0.0 if math.isnan(metrics[b]) else
                                             (-metrics[b] if mode == "max" else metrics[b]), b))
    top = set(ranked[: max(1, n // factor)])
    assert batch == [C if (b in top and not math.isnan(metrics[b])) else Stop(0, 1) for b in range(before, n)]
    assert [e.n for e in h.arrivals.get((None, 0), [])][before:] == [n] * (n - before)  # together: one n


def test_compiled_iterative_tasks_are_wrapped_under_their_own_keys():
    from graph.tasks.iterative import Iterative, iterative_task

    node = runs().explore("fit", grid(fit, lr=[0.1, 0.2])).choose("accuracy", prune=halving(max_iter=2))
    c = graph.compile(node)
    prune = c.chooses[0].spec.prune
    wrapped = {k: iterative_task(t, prune) if k.startswith("fit-") else t for k, t in c.graph.items()}
    assert sorted(wrapped) == sorted(c.graph)
    assert all(isinstance(wrapped[b.key].func, Iterative) for b in c.chooses[0].inputs)
    # run outside a cluster (no reports, rungs pass): max_iter=2 stops fit (3 epochs) at its 2nd report
    from dask.local import get_sync

    assert get_sync(wrapped, [b.key for b in c.branches]) == ({"accuracy": 0.2}, {"accuracy": 0.4})
    with pytest.raises(ValueError, match="two pruning chooses with different rules"):
        iterative_task(wrapped[c.chooses[0].inputs[0].key], PruneSpec(2, 1))
