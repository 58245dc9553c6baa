"""Pruning chooses inside the exploration state machine (docs/architecture.md §7.2), without a
cluster: literal Report events in, literal Answer / Cancel / Release instructions out, and
hypothesis over random report orders against a literal transcription of the halving rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph.tasks.iterative import Iterative
from graph.state.halving import Pruned
from graph.state import (
    Answer,
    Cancel,
    ChooseDecided,
    ExplorationState,
    Finished,
    Gather,
    MetricRead,
    Release,
    Report,
    Start,
    Submit,
    TaskFailed,
    TaskFinished,
    Warn,
)
from pipelines import Pipeline, grid, halving
from tests import prune_steps as ps

A = ("a", (0.1, 0.2, 0.3, 0.4))
B = ("b", (0.5, 0.6, 0.7, 0.8))
C = ("c", (0.2, 0.3, 0.35, 0.36))


def pipeline(curves, prune=halving(factor=2), **choose):
    node = Pipeline("p").source(ps.data).explore("c", grid(ps.curve, spec=list(curves), log_dir=["/x"]))
    return node.choose("score", prune=prune, **choose).compile()


def kinds(out):
    """Instruction kinds, in order (a rung's Answer comes last: a stop's Cancel goes out first)."""
    return [type(i).__name__ for i in out]


def finish(s, c, i, value):
    """Branch ``i``'s step returned; its metric task finished and was read as ``value``."""
    out = s.handle(TaskFinished(c.chooses[0].inputs[i].key))
    mk = c.chooses[0].metric_keys[i]
    out += s.handle(TaskFinished(mk))
    assert any(isinstance(x, Gather) and mk in x.names for x in out)
    return out + s.handle(MetricRead(mk, value, {"score": value}))


def test_reports_that_arrive_together_are_ranked_together():
    # a packed task sends its members' reports of one epoch at once: ranked one after another, the
    # first would go on against itself alone (max(1, 1 // 2) = 1), whatever the others say
    c = pipeline([A, B, C])
    ka, kb, kc = (b.key for b in c.chooses[0].inputs)
    ma, mb, mc = c.chooses[0].metric_keys
    s = ExplorationState(c)
    s.handle(Start())
    out = s.handle(Report(ka, 1, {"score": 0.1}), Report(kb, 1, {"score": 0.5}))
    assert out == [Cancel((ma,)), Answer(ka, 1, "stop"), Answer(kb, 1, "continue")]  # top 1 of 2
    # one at a time (separate events), the first arrival goes on: the rule itself is unchanged
    s2 = ExplorationState(c)
    s2.handle(Start())
    assert s2.handle(Report(ka, 1, {"score": 0.1})) == [Answer(ka, 1, "continue")]
    assert s2.handle(Report(kb, 1, {"score": 0.5})) == [Answer(kb, 1, "continue")]
    # a step's second report in the same call is decided after its first (here: past a stop)
    s3 = ExplorationState(c)
    s3.handle(Start())
    s3.handle(Report(kb, 1, {"score": 0.5}))
    out = s3.handle(Report(ka, 1, {"score": 0.1}), Report(ka, 2, {"score": 0.9}), Report(kc, 1, {"score": 0.2}))
    assert Answer(ka, 1, "stop") in out and Answer(kc, 1, "stop") in out
    assert Answer(ka, 2, "stop") in out and Answer(ka, 2, "continue") not in out  # its stop stands
    assert s3.pruned_at[ka] == (0, 1)


def test_a_pruning_run_as_literal_events_and_instructions():
    c = pipeline([A, B, C])
    ka, kb, kc = (b.key for b in c.chooses[0].inputs)
    ma, mb, mc = c.chooses[0].metric_keys
    s = ExplorationState(c)
    assert kinds(s.handle(Start())) == ["Submit"]
    # rungs at 1, 2, 4 (factor 2): keep the top max(1, n // 2) of the n there so far
    assert s.handle(Report(kb, 1, {"score": 0.5})) == [Answer(kb, 1, "continue")]  # first there
    assert s.handle(Report(ka, 1, {"score": 0.1})) == [Cancel((ma,)), Answer(ka, 1, "stop")]  # 2nd of 2, worse
    assert s.handle(Report(ka, 1, {"score": 0.1})) == []  # a replay: counted once, answered once
    assert s.handle(Report(kb, 2, {"score": 0.6})) == [Answer(kb, 2, "continue")]
    assert s.handle(Report(kb, 3, {"score": 0.7})) == []  # not a rung: no one waits
    assert s.handle(Report(kc, 1, {"score": 0.2})) == [Cancel((mc,)), Answer(kc, 1, "stop")]  # 3rd: top 1 of 3
    # the stopped steps were held (not cancelled) until they return Pruned: their time is measured
    assert s.handle(TaskFinished(ka)) == [Release((ka,))]
    out = s.handle(Report(kb, 4, {"score": 0.8}))
    assert out == [Answer(kb, 4, "continue")]
    out = finish(s, c, 1, 0.8)
    decided = [x for x in out if isinstance(x, ChooseDecided)]
    assert decided == [ChooseDecided(0, None, (1,), (), ())]  # the pruned ones are no input of the decision
    assert isinstance(out[-1], Finished)
    rows = s.rows()
    assert [r.status for r in rows] == ["pruned", "ok", "pruned"]
    assert [r.chosen for r in rows] == [False, True, False]
    assert [r.iterations for r in rows] == [1, 4, 1] and [r.pruned_at for r in rows] == [1, None, 1]
    assert rows[1].history == [{"score": v} for v in (0.5, 0.6, 0.7, 0.8)]
    assert s.progress()["best"].endswith("reports 6, rungs 5, pruned 2 at rung 0")
    assert [(e["rung"], e["input"], e["continued"], e["n"]) for e in s.rung_log()] == [
        (0, 1, True, 1), (0, 0, False, 2), (0, 2, False, 3), (1, 1, True, 1), (2, 1, True, 1)]


def test_a_recomputed_step_replaying_a_rung_under_its_new_name_gets_the_same_answer():
    c = pipeline([A, B])
    ka, kb = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(Report(kb, 1, {"score": 0.5}))
    assert s.handle(Report(kb, 2, {"score": 0.6})) == [Answer(kb, 2, "continue")]
    again = kb + "~again1"  # graph.keys.recompute_key: it waits at its rungs under its own name
    assert s.handle(Report(again, 1, {"score": 0.5})) == [Answer(again, 1, "continue")]
    assert s.handle(Report(again, 1, {"score": 0.5})) == []
    assert s.handle(Report(again, 5, {"score": 0.9})) == []  # a gap is never guessed
    assert s.handle(Report(again, 2, {"score": 0.6})) == [Answer(again, 2, "continue")]
    assert len(s.history[kb]) == 2 and s.rungs_answered == 2


def test_a_failing_branch_never_blocks_a_rung_and_the_choose_decides_among_the_finished():
    c = pipeline([A, B, C])
    ka, kb, kc = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    assert s.handle(Report(ka, 1, {"score": 0.1})) == [Answer(ka, 1, "continue")]
    s.handle(TaskFailed(ka, "RuntimeError: boom"))  # a failure after its first rung: its arrival stays counted
    assert s.handle(Report(kb, 1, {"score": 0.5})) == [Answer(kb, 1, "continue")]  # top 1 of 2
    mc = c.chooses[0].metric_keys[2]
    assert s.handle(Report(kc, 1, {"score": 0.2})) == [Cancel((mc,)), Answer(kc, 1, "stop")]
    for it, v in ((2, 0.6), (3, 0.7), (4, 0.8)):
        s.handle(Report(kb, it, {"score": v}))
    out = finish(s, c, 1, 0.8)
    # the failed one is dropped as by any choose; the pruned one is no input of the decision
    assert [x for x in out if isinstance(x, ChooseDecided)] == [ChooseDecided(0, None, (1,), (0,), ())]
    assert [r.status for r in s.rows()] == ["failed", "ok", "pruned"]
    assert [r.iterations for r in s.rows()] == [1, 4, 1]


def test_per_groups_are_halved_separately_and_k_keeps_among_the_finished():
    node = Pipeline("p").source(ps.data).explore("g", grid(ps.tag, g=["x", "y"]))
    node = node.explore("c", grid(ps.curve, spec=[A, B, C], log_dir=["/x"]))
    c = node.choose("score", prune=halving(factor=3, max_iter=4), per="g", k=1).compile()
    keys = [b.key for b in c.chooses[0].inputs]
    groups = [c.chooses[0].group_of(i) for i in range(6)]
    assert groups[0] == groups[2] != groups[3] == groups[5]
    s = ExplorationState(c)
    s.handle(Start())
    # group x: b, then a, then c at rung 1 (top max(1, n // 3)); group y: a first, alone there
    assert s.handle(Report(keys[1], 1, {"score": 0.5}))[-1] == Answer(keys[1], 1, "continue")
    assert s.handle(Report(keys[0], 1, {"score": 0.1}))[-1] == Answer(keys[0], 1, "stop")
    assert s.handle(Report(keys[3], 1, {"score": 0.1}))[-1] == Answer(keys[3], 1, "continue")  # another group
    assert s.handle(Report(keys[2], 1, {"score": 0.2}))[-1] == Answer(keys[2], 1, "stop")
    assert s.handle(Report(keys[4], 1, {"score": 0.5}))[-1] == Answer(keys[4], 1, "continue")
    assert s.handle(Report(keys[5], 1, {"score": 0.2}))[-1] == Answer(keys[5], 1, "stop")
    # max_iter=4: the 4th report finishes the branch (no rung, no answer); rung 3 is below it
    for k, curve in ((keys[1], B), (keys[3], A), (keys[4], B)):
        for it in (2, 3, 4):
            out = s.handle(Report(k, it, {"score": curve[1][it - 1]}))
            assert out == ([Answer(k, 3, "continue")] if it == 3 else [])
    # rung 1 (iteration 3): group y holds branches 3 and 4: 4 (0.7) arrived after 3 (0.3)
    assert [(e["group"], e["input"], e["continued"], e["n"]) for e in s.rung_log() if e["rung"] == 1] == [
        (groups[1], 1, True, 1), (groups[3], 3, True, 1), (groups[4], 4, True, 2)]
    out = finish(s, c, 1, 0.8) + finish(s, c, 3, 0.4) + finish(s, c, 4, 0.8)
    decided = sorted((x.group, x.keep) for x in out if isinstance(x, ChooseDecided))
    assert decided == sorted([(groups[1], (1,)), (groups[4], (4,))])
    assert [r.status for r in s.rows()] == ["pruned", "ok", "pruned", "ok", "ok", "pruned"]
    assert [r.chosen for r in s.rows()] == [False, True, False, False, True, False]


def test_a_report_without_the_metric_warns_once_and_never_continues():
    c = pipeline([A, B, C])
    ka, kb, kc = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    first = s.handle(Report(ka, 1, {"acc": 0.9}))
    assert kinds(first) == ["Warn", "Cancel", "Answer"] and first[2] == Answer(ka, 1, "stop")  # NaN never continues
    assert "a report gives no metric" in first[0].message and "no key 'score'" in first[0].message
    second = s.handle(Report(kb, 1, {"acc": 0.9}))
    assert kinds(second) == ["Cancel", "Answer"] and second[1] == Answer(kb, 1, "stop")  # warned once


def test_reports_without_a_pruning_choose_are_history_only_and_the_table_counts_them():
    node = Pipeline("p").source(ps.data).explore("c", grid(ps.curve, spec=[A, B], log_dir=["/x"])).choose("score")
    c = node.compile()
    ka, kb = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    assert s.handle(Report(ka, 1, {"score": 0.1}), Report(ka, 2, {"score": 0.2})) == []
    assert [r.iterations for r in s.rows()] == [2, 0]
    plain = Pipeline("p").source(ps.data).explore("c", grid(ps.plain, spec=[A, B])).choose("score").compile()
    s = ExplorationState(plain)
    s.handle(Start())
    assert s.handle(Report(plain.branches[0].key, 1, {"score": 1.0})) == []  # not this run's iterative step
    assert [r.iterations for r in s.rows()] == [None, None]  # no iterative step: no column


def transcription(factor: int, arrivals: list[tuple[int, int, float]]) -> dict[tuple[int, int], bool]:
    """The rule of docs/architecture.md §7, written out plainly: at a rung, continue iff within
    the top max(1, n // factor) of the n there so far (higher first, ties to the lower branch)."""
    seen: dict[int, list[tuple[float, int]]] = {}
    out = {}
    for branch, rung, metric in arrivals:
        there = seen.setdefault(rung, [])
        there.append((metric, branch))
        ranked = sorted(there, key=lambda mb: (-mb[0], mb[1]))
        out[(branch, rung)] = ranked.index((metric, branch)) < max(1, len(there) // factor)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    curves=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=9), min_size=2, max_size=5),
    factor=st.integers(2, 3),
    seed=st.randoms(use_true_random=False),
)
def test_random_report_orders_get_the_answers_of_the_rule(curves, factor, seed):
    specs = [(f"b{i}", tuple(float(v) for v in cv)) for i, cv in enumerate(curves)]
    c = pipeline(specs, prune=halving(factor=factor))
    keys = [b.key for b in c.chooses[0].inputs]
    s = ExplorationState(c)
    s.handle(Start())
    made = [0] * len(specs)
    stopped = [False] * len(specs)
    prune = c.chooses[0].spec.prune
    arrivals, answers = [], {}
    while True:
        live = [i for i in range(len(specs)) if not stopped[i] and made[i] < len(specs[i][1])]
        if not live:
            break
        i = seed.choice(live)
        made[i] += 1
        metric = specs[i][1][made[i] - 1]
        out = s.handle(Report(keys[i], made[i], {"score": metric}))
        r = prune.rung_of(made[i])
        got = [x for x in out if isinstance(x, Answer)]
        if r is None:
            assert got == []
            continue
        arrivals.append((i, r, metric))
        assert got == [Answer(keys[i], made[i], got[0].answer)]
        answers[(i, r)] = got[0].answer == "continue"
        stopped[i] = got[0].answer == "stop"
    assert answers == transcription(factor, arrivals)
    out = [x for i in range(len(specs)) if not stopped[i] for x in finish(s, c, i, specs[i][1][-1])]
    assert isinstance(out[-1], Finished)
    rows = s.rows()
    for i, row in enumerate(rows):
        assert row.iterations == made[i]
        assert (row.status == "pruned") == stopped[i] and (row.pruned_at == made[i] if stopped[i] else row.pruned_at is None)


def test_a_step_may_offer_its_iterations_through_quiver_iterate():
    """The hook gpu.train uses: called plainly it returns its value; a run iterates
    ``__quiver_iterate__`` (a generator of per-epoch reports returning the final value)."""

    def train(x, epochs):
        return {"acc": 1.0, "plain": True}

    def iterate(x, epochs):
        for e in range(epochs):
            yield {"acc": x * (e + 1)}
        return {"acc": x * epochs, "plain": False}

    train.__quiver_iterate__ = iterate
    train.__quiver_iterative__ = True
    assert Iterative(train)(0.25, epochs=3) == {"acc": 0.75, "plain": False}
    from graph.tasks.iterative import is_iterative

    assert is_iterative(train)


def test_a_pruned_step_stores_nothing(tmp_path):
    from graph.tasks.store import ResultStore
    from graph.compiling.transform import SaveResult

    store = ResultStore(tmp_path)
    SaveResult(lambda: Pruned(2, {"score": 0.1}), store.file("k1"), "k1")()
    SaveResult(lambda: {"score": 0.9}, store.file("k2"), "k2")()
    SaveResult(lambda v: (float("nan"), {}), store.file("m1"), "m1")(Pruned(2, {"score": 0.1}))  # its metric read
    assert "k1" not in store and "m1" not in store and "k2" in store


def test_a_metric_read_of_a_stopped_step_is_a_quiet_nan():
    """The run cancels it when it stops the step, but a cancel may reach the scheduler after
    the step returned: the read must not log a failure on the worker (nothing reads it)."""
    from graph.state.metric import extract_metric

    metric, scalars = extract_metric(Pruned(2, {"score": 0.3}), "score", "choose('score')")
    assert math.isnan(metric) and scalars == {}


def test_steps_after_a_pruning_choose_run_for_the_kept_branch_only():
    node = Pipeline("p").source(ps.data).explore("c", grid(ps.curve, spec=[A, B], log_dir=["/x"]))
    c = node.choose("score", prune=halving(factor=2)).then(ps.tag, g="z").compile()
    ka, kb = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    first = s.handle(Start())
    assert all(k not in first[0].tasks for k in (c.branches[0].key, c.branches[1].key))  # behind the choose
    s.handle(Report(kb, 1, {"score": 0.5}))
    assert s.handle(Report(ka, 1, {"score": 0.1}))[-1] == Answer(ka, 1, "stop")
    s.handle(TaskFinished(ka))
    for it, v in ((2, 0.6), (3, 0.7), (4, 0.8)):
        s.handle(Report(kb, it, {"score": v}))
    out = finish(s, c, 1, 0.8)
    submits = [x for x in out if isinstance(x, Submit)]
    assert [list(x.tasks) for x in submits] == [[c.branches[1].key]]  # the pruned branch's next step never runs
    assert isinstance(s.handle(TaskFinished(c.branches[1].key))[-1], Finished)
    rows = s.rows()
    assert [(r.status, r.chosen, r.iterations) for r in rows] == [("pruned", False, 1), ("ok", True, 4)]


def test_a_pruned_step_counts_every_branch_it_ends_in_the_progress_line_and_stats():
    """A pruning choose followed by an explore: one stopped step ends two output branches, and
    the progress line and ``stats["pruned_branches"]`` count branches (the table's rows), not steps."""
    node = Pipeline("p").source(ps.data).explore("c", grid(ps.curve, spec=[A, B], log_dir=["/x"]))
    c = node.choose("score", prune=halving(factor=2)).explore("e", grid(ps.tag, g=["y", "z"])).compile()
    ka, kb = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(Report(kb, 1, {"score": 0.5}))
    assert s.handle(Report(ka, 1, {"score": 0.1}))[-1] == Answer(ka, 1, "stop")
    pruned_rows = sum(s.status(j) == "pruned" for j in range(len(c.branches)))  # live statuses
    assert pruned_rows == 2
    assert s.pruned_branches() == pruned_rows
    assert "pruned 2 at rung 0" in s.pruning_line()


def test_the_history_is_not_copied_by_every_operation_on_the_table():
    """pandas deep-copies a table's ``attrs`` on every operation (a column, a filter): a long
    run's history (branches x reports) made each of them take seconds. The history is a record
    of the run, shared by the tables derived from the result's table."""
    import copy

    from graph.report.table import build_table

    c = Pipeline("p").source(ps.data).explore("c", grid(ps.curve, spec=[A, B], log_dir=["/x"])).choose("score").compile()
    ka, _ = (b.key for b in c.chooses[0].inputs)
    s = ExplorationState(c)
    s.handle(Start())
    s.handle(*(Report(ka, i, {"score": 0.1 * i}) for i in range(1, 4)))
    table, _ = build_table(c, s.rows(), {}, {})
    history = table.attrs["history"]
    assert [len(h) for h in history] == [3, 0] and history[0][2] == {"score": pytest.approx(0.3)}
    assert table["status"].attrs["history"] is history
    assert table[table["iterations"] > 0].attrs["history"] is history
    assert copy.deepcopy(history) is history


def test_a_report_from_an_execution_the_run_did_not_start_is_still_answered_at_its_rung():
    """Dask resumes a task that an earlier run on the client cancelled while it was executing
    (a first-k-above-threshold cancel, an abort) when the next run submits the same key: the
    step goes on reporting from where it was, and this run never saw its first reports. At a
    rung it waits for an answer, so it must get one (ranked by this report's metric), not be
    ignored (it would wait for ever and hold the run)."""
    c = pipeline([A, B, C])
    ka, kb, kc = (b.key for b in c.chooses[0].inputs)
    ma, mb, mc = c.chooses[0].metric_keys
    s = ExplorationState(c)
    s.handle(Start())
    assert s.handle(Report(ka + "~again9", 2, {"score": 0.9})) == []  # not submitted by this run: not its step
    assert s.handle(Report(ka, 2, {"score": 0.3})) == [Answer(ka, 2, "continue")]  # first at rung 2
    assert s.handle(Report(kc, 2, {"score": 0.1})) == [Cancel((mc,)), Answer(kc, 2, "stop")]  # 2nd, worse
    assert s.handle(Report(ka, 3, {"score": 0.4})) == []  # not a rung
    assert s.handle(Report(kb, 1, {"score": 0.5})) == [Answer(kb, 1, "continue")]  # from the start: as ever
    assert [r.iterations for r in s.rows()][1] == 1


def test_collection_graph_entries_are_not_iterative_steps():
    """Collections put Alias and DataNode entries (no ``func``) in the compiled graph; the machine's
    scan for iterative steps skips them (it raised AttributeError on the big-table example)."""
    from dask.task_spec import Alias, DataNode

    from graph.state.machine import runs_iterative

    assert not runs_iterative(Alias("a", "b")) and not runs_iterative(DataNode("d", 3))
