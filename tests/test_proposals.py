"""The adaptive search's rule (graph/state/proposals.py), with literal events: a slot frees -> one
ask; a pruned trial is told PRUNED; a failed trial is told FAIL and the search goes on; n_trials
is never exceeded; shared keys are submitted once (issue 47)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.state.events import Abort, Cancel, Finished, Gather, MetricRead, MetricSent, Release, TaskFailed, TaskFinished
from graph.state.proposals import (
    COMPLETE,
    FAIL,
    PRUNED,
    Ask,
    Judge,
    ProposalRule,
    Proposed,
    Reported,
    Run,
    SearchStart,
    Tell,
    Verdict,
)


def asks(out):
    return sum(isinstance(i, Ask) for i in out)


def tells(out):
    return [i for i in out if isinstance(i, Tell)]

def _follow(out, running, submitted, reads, told):
    """Carry out a handling's instructions on the random-order tests' lists (tasks running, names
    submitted, metric reads to answer, trials told); return how many proposals it asked for."""
    asked = 0
    for ins in out:
        if isinstance(ins, Ask):
            asked += 1
        elif isinstance(ins, Run):
            running.extend(ins.names)
            submitted.extend(ins.names)
        elif isinstance(ins, Gather):
            reads.extend(ins.names)
        elif isinstance(ins, Tell):
            told.append(ins.trial)
    return asked


def test_start_asks_one_proposal_per_slot_and_no_more_than_n_trials():
    assert ProposalRule(n_trials=10, in_flight=3).handle(SearchStart()) == [Ask(), Ask(), Ask()]
    assert ProposalRule(n_trials=2, in_flight=3).handle(SearchStart()) == [Ask(), Ask()]


def test_a_slot_frees_one_ask_follows():
    rule = ProposalRule(n_trials=5, in_flight=2)
    rule.handle(SearchStart())
    assert rule.handle(Proposed(0, ("load", "fit-a"), "m-a")) == [Run(("load", "fit-a", "m-a"), 0)]
    # the second proposal shares the source: only its new keys are submitted
    assert rule.handle(Proposed(1, ("load", "fit-b"), "m-b")) == [Run(("fit-b", "m-b"), -1)]
    assert rule.handle(TaskFinished("load"), TaskFinished("fit-a")) == []
    assert rule.handle(TaskFinished("m-a")) == [Gather(("m-a",))]
    out = rule.handle(MetricRead("m-a", 0.5))
    assert tells(out) == [Tell(0, COMPLETE, 0.5)]
    assert asks(out) == 1  # exactly one: the other slot is still busy with trial 1


def test_a_shared_prefix_in_flight_is_not_submitted_again():
    rule = ProposalRule(n_trials=3, in_flight=3)
    rule.handle(SearchStart())
    runs = [rule.handle(Proposed(t, ("load", "pca", f"fit-{t}"), f"m-{t}")) for t in range(3)]
    submitted = [k for out in runs for i in out if isinstance(i, Run) for k in i.names]
    assert sorted(submitted) == sorted({"load", "pca", "fit-0", "fit-1", "fit-2", "m-0", "m-1", "m-2"})
    assert rule.reused == 4  # load and pca, twice


def test_a_failed_trial_is_told_fail_and_the_search_goes_on():
    rule = ProposalRule(n_trials=3, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit-a"), "m-a"))
    out = rule.handle(TaskFinished("load"), TaskFailed("fit-a", "ValueError: bad C"))
    assert tells(out) == [Tell(0, FAIL, None, "ValueError: bad C")]
    assert asks(out) == 1
    rule.handle(Proposed(1, ("load", "fit-b"), "m-b"))
    rule.handle(TaskFinished("fit-b"), TaskFinished("m-b"))
    assert tells(rule.handle(MetricRead("m-b", 0.7))) == [Tell(1, COMPLETE, 0.7)]


def test_a_failed_prefix_fails_every_open_trial_through_it_and_a_later_proposal_at_once():
    rule = ProposalRule(n_trials=4, in_flight=2)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "pca", "fit-a"), "m-a"), Proposed(1, ("load", "pca", "fit-b"), "m-b"))
    out = rule.handle(TaskFinished("load"), TaskFailed("pca", "MemoryError: "))
    assert [(t.trial, t.state) for t in tells(out)] == [(0, FAIL), (1, FAIL)]
    assert asks(out) == 2
    out = rule.handle(Proposed(2, ("load", "pca", "fit-c"), "m-c"))
    assert not any(isinstance(i, Run) for i in out)  # the same work would fail the same way
    assert tells(out) == [Tell(2, FAIL, None, "MemoryError: ")]


def test_a_pruned_step_is_told_pruned():
    rule = ProposalRule(n_trials=2, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "train"), "m"))
    out = rule.handle(TaskFinished("load"), TaskFailed("train", "TrialPruned: diverged"))
    assert tells(out) == [Tell(0, PRUNED, None, "TrialPruned: diverged")]
    assert asks(out) == 1


def test_a_proposal_that_does_not_compile_is_a_failed_trial():
    rule = ProposalRule(n_trials=1, in_flight=1)
    rule.handle(SearchStart())
    out = rule.handle(Proposed(0, (), "", error="PipelineError: no key"))
    assert out == [Tell(0, FAIL, None, "PipelineError: no key"), Finished()]


def test_the_same_configuration_again_is_told_its_value_without_running():
    rule = ProposalRule(n_trials=2, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit"), "m"))
    rule.handle(TaskFinished("load"), TaskFinished("fit"), TaskFinished("m"))
    rule.handle(MetricRead("m", 0.25))
    out = rule.handle(Proposed(1, ("load", "fit"), "m"))
    assert out == [Tell(1, COMPLETE, 0.25), Finished()]
    assert rule.submitted == 3


def test_a_nan_metric_is_a_failed_trial():
    rule = ProposalRule(n_trials=1, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("fit",), "m"))
    rule.handle(TaskFinished("fit"), TaskFinished("m"))
    [tell] = tells(rule.handle(MetricRead("m", float("nan"))))
    assert tell.state == FAIL and "NaN" in tell.error


def test_the_best_trials_result_is_held_the_others_let_go():
    rule = ProposalRule(n_trials=3, in_flight=1, mode="min")
    rule.handle(SearchStart())
    released = []
    for t, value in enumerate([0.5, 0.3, 0.9]):
        rule.handle(Proposed(t, ("load", f"fit-{t}"), f"m-{t}"))
        rule.handle(TaskFinished("load"), TaskFinished(f"fit-{t}"), TaskFinished(f"m-{t}"))
        released += [k for i in rule.handle(MetricRead(f"m-{t}", value)) if isinstance(i, Release) for k in i.names]
    assert rule.best == 1
    assert "fit-1" not in released and {"fit-0", "fit-2"} <= set(released)
    assert "load" not in released  # a prefix a later proposal may share is held for the search


def test_abort_fails_the_open_trials_and_asks_no_more():
    rule = ProposalRule(n_trials=10, in_flight=2)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("a",), "ma"), Proposed(1, ("b",), "mb"))
    out = rule.handle(Abort("Ctrl-C"))
    assert [t.state for t in tells(out)] == [FAIL, FAIL]
    assert out[-1] == Finished() and asks(out) == 0


@settings(max_examples=150, deadline=None)
@given(
    n_trials=st.integers(1, 12),
    in_flight=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    fail_rate=st.sampled_from([0.0, 0.2, 0.6]),
)
def test_random_orders_never_exceed_n_trials_or_in_flight_and_tell_each_trial_once(n_trials, in_flight, seed, fail_rate):
    """Proposals over a small space (so keys repeat), outcomes in a random order."""
    rng = random.Random(seed)
    rule = ProposalRule(n_trials=n_trials, in_flight=in_flight)
    pending_asks = asks(rule.handle(SearchStart()))
    running: list[str] = []  # submitted keys with no outcome yet
    done_metrics: list[str] = []
    told: list[int] = []
    submitted: list[str] = []
    trial = 0
    for _ in range(10_000):
        if rule.finished:
            break
        choices = []
        if pending_asks:
            choices.append("propose")
        if running:
            choices.append("outcome")
        if done_metrics:
            choices.append("read")
        assert choices, "the search is stuck"
        what = rng.choice(choices)
        if what == "propose":
            pending_asks -= 1
            pre, fit = f"pre-{rng.randrange(2)}", f"fit-{rng.randrange(3)}"
            out = rule.handle(Proposed(trial, (f"load", pre, f"{fit}@{pre}"), f"m@{fit}@{pre}"))
            trial += 1
        elif what == "outcome":
            name = running.pop(rng.randrange(len(running)))
            if rng.random() < fail_rate:
                out = rule.handle(TaskFailed(name, "ValueError: x"))
            else:
                out = rule.handle(TaskFinished(name))
        else:
            name = done_metrics.pop(rng.randrange(len(done_metrics)))
            out = rule.handle(MetricRead(name, rng.random()))
        pending_asks += _follow(out, running, submitted, done_metrics, told)
        assert rule.asked <= n_trials
        assert len(rule.open) + rule.asking <= in_flight
    assert rule.finished
    assert sorted(told) == list(range(n_trials))  # every trial told exactly once
    assert len(submitted) == len(set(submitted))  # every key submitted once: executed = unique


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        ProposalRule(n_trials=0, in_flight=1)


def test_a_metric_the_last_step_sends_is_told_without_a_read_task():
    rule = ProposalRule(n_trials=2, in_flight=1)
    rule.handle(SearchStart())
    assert rule.handle(Proposed(0, ("load", "fit"), "m", fused=True)) == [Run(("load", "fit"), 0)]
    out = rule.handle(TaskFinished("load"), MetricSent("m", "fit", 0.8, {"acc": 0.8}), TaskFinished("fit"))
    assert tells(out) == [Tell(0, COMPLETE, 0.8)] and not any(isinstance(i, (Run, Gather)) for i in out)
    assert asks(out) == 1


def test_a_step_that_finished_without_its_message_gets_its_read_task_after_all():
    rule = ProposalRule(n_trials=1, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit"), "m", fused=True))
    assert rule.handle(TaskFinished("load"), TaskFinished("fit")) == [Run(("m",), 0)]
    assert rule.handle(TaskFinished("m")) == [Gather(("m",))]
    out = rule.handle(MetricRead("m", 0.4))
    assert tells(out) == [Tell(0, COMPLETE, 0.4)]
    # a message arriving late is not counted twice
    assert rule.handle(MetricSent("m", "fit", 0.9)) == []


def test_a_sent_metric_error_fails_the_trial_and_a_later_leaf_completion_is_let_go():
    rule = ProposalRule(n_trials=2, in_flight=1)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit"), "m", fused=True))
    out = rule.handle(MetricSent("m", "fit", None, error="KeyError: 'acc'"))
    assert tells(out) == [Tell(0, FAIL, None, "KeyError: 'acc'")]
    assert Release(("fit",)) in rule.handle(TaskFinished("load"), TaskFinished("fit"))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), lost=st.sampled_from([0.0, 0.3]))
def test_random_orders_of_sent_metrics_tell_each_trial_once_and_submit_each_key_once(seed, lost):
    """Fused last steps: the message comes with, before, after, or (``lost``) never with the
    step's completion; every trial is told once and nothing is submitted twice."""
    rng = random.Random(seed)
    n_trials, in_flight = 10, 3
    rule = ProposalRule(n_trials=n_trials, in_flight=in_flight)
    pending_asks = asks(rule.handle(SearchStart()))
    running: list[str] = []
    later: list = []  # messages held back
    reads: list[str] = []
    told, submitted, trial = [], [], 0
    for _ in range(10_000):
        if rule.finished:
            break
        choices = (["propose"] if pending_asks else []) + (["outcome"] if running else []) + \
            (["late"] if later else []) + (["read"] if reads else [])
        assert choices, "the search is stuck"
        what = rng.choice(choices)
        if what == "propose":
            pending_asks -= 1
            leaf = f"fit-{rng.randrange(4)}"
            out = rule.handle(Proposed(trial, ("load", leaf), f"m@{leaf}", fused=True))
            trial += 1
        elif what == "outcome":
            name = running.pop(rng.randrange(len(running)))
            events = [TaskFinished(name)]
            if name.startswith("fit-") and rng.random() >= lost:
                msg = MetricSent(f"m@{name}", name, rng.random())
                if rng.random() < 0.3:
                    later.append(msg)
                else:
                    events.insert(0, msg)
            out = rule.handle(*events)
        elif what == "late":
            out = rule.handle(later.pop(rng.randrange(len(later))))
        else:
            name = reads.pop(rng.randrange(len(reads)))
            out = rule.handle(MetricRead(name, rng.random()))
        pending_asks += _follow(out, running, submitted, reads, told)
        assert len(rule.open) + rule.asking <= in_flight
    assert rule.finished
    assert sorted(told) == list(range(n_trials))
    assert len(submitted) == len(set(submitted))


# ---- a study's pruner stops a generator step mid-training --------------------------------------------
def _one_running(n_trials=1, in_flight=1):
    rule = ProposalRule(n_trials=n_trials, in_flight=in_flight)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit-a"), "m@a"))
    return rule


def test_each_report_of_a_last_step_is_judged_once_per_step():
    rule = _one_running()
    assert rule.handle(Reported("fit-a", 1, 0.3)) == [Judge(0, 1, 0.3)]
    assert rule.handle(Verdict(0, 1, prune=False)) == []
    assert rule.handle(Reported("fit-a", 1, 0.3)) == []  # judged at step 1 already
    assert rule.handle(Reported("load", 1, 0.3)) == []  # a prefix step's reports are not the trial's
    assert rule.handle(Reported("fit-x", 1, 0.3)) == []  # not this search's
    assert rule.handle(Reported("fit-a", 2, 0.5)) == [Judge(0, 2, 0.5)]


def test_a_prune_verdict_tells_pruned_with_the_last_value_and_stops_the_step_and_its_read():
    rule = _one_running(n_trials=2)
    rule.handle(Reported("fit-a", 1, 0.3), Reported("fit-a", 2, 0.25))
    out = rule.handle(Verdict(0, 2, prune=True))
    assert out[:2] == [Tell(0, PRUNED, 0.25, "TrialPruned: the study's pruner stopped it at step 2"),
                       Cancel(("fit-a", "m@a"))]
    assert asks(out) == 1 and rule.stopped == 1  # its slot frees at once
    assert rule.trials[0].value == 0.25 and rule.best is None  # a pruned trial is never the best
    # the stopped step's own end (cancelled, or finished while the stop travelled) changes nothing
    assert rule.handle(TaskFailed("fit-a", "CancelledError: x"), TaskFinished("m@a")) == []
    assert rule.handle(Reported("fit-a", 3, 0.2)) == []  # a report still in flight: no open trial
    # the same configuration again is pruned at once, nothing submitted
    out = rule.handle(Proposed(1, ("load", "fit-a"), "m@a"))
    assert tells(out) == [Tell(1, PRUNED, None, "TrialPruned: the study's pruner stopped it at step 2")]
    assert not any(isinstance(i, Run) for i in out) and rule.finished


def test_a_verdict_after_the_trial_was_told_or_a_continue_changes_nothing():
    rule = _one_running()
    rule.handle(Reported("fit-a", 1, 0.3))
    rule.handle(TaskFailed("fit-a", "ValueError: boom"))
    assert rule.trials[0].state == FAIL
    assert rule.handle(Verdict(0, 1, prune=True)) == []


def test_a_step_shared_by_two_open_trials_stops_only_when_both_are_pruned():
    rule = ProposalRule(n_trials=2, in_flight=2)
    rule.handle(SearchStart())
    rule.handle(Proposed(0, ("load", "fit-a"), "m@a"))
    rule.handle(Proposed(1, ("load", "fit-a"), "m@a"))  # the same configuration, in flight: shared
    assert rule.handle(Reported("fit-a", 1, 0.3)) == [Judge(0, 1, 0.3), Judge(1, 1, 0.3)]
    out = rule.handle(Verdict(0, 1, prune=True))
    assert tells(out) == [Tell(0, PRUNED, 0.3, "TrialPruned: the study's pruner stopped it at step 1")]
    assert not any(isinstance(i, Cancel) for i in out)  # trial 1 still trains on it
    assert rule.handle(Reported("fit-a", 2, 0.4)) == [Judge(1, 2, 0.4)]
    out = rule.handle(Verdict(1, 2, prune=True))
    assert Cancel(("fit-a", "m@a")) in out and rule.finished


def test_a_trial_not_pruned_completes_with_its_read_metric():
    rule = _one_running()
    rule.handle(Reported("fit-a", 1, 0.3), Verdict(0, 1, prune=False))
    out = rule.handle(TaskFinished("load"), TaskFinished("fit-a"), TaskFinished("m@a"))
    assert out == [Gather(("m@a",))]
    out = rule.handle(MetricRead("m@a", 0.9))
    assert tells(out) == [Tell(0, COMPLETE, 0.9, None)] and rule.stopped == 0


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), prune_rate=st.sampled_from([0.0, 0.3, 0.8]), in_flight=st.integers(1, 4))
def test_random_reports_and_verdicts_tell_each_trial_once_and_stop_only_steps_no_open_trial_needs(
        seed, prune_rate, in_flight):
    """Generator last steps report in random order among the outcomes, each report judged at
    once with a random verdict; a stopped step's own end comes later (cancelled) or not at all."""
    rng = random.Random(seed)
    n_trials = 10
    rule = ProposalRule(n_trials=n_trials, in_flight=in_flight)
    pending_asks = asks(rule.handle(SearchStart()))
    running: list[str] = []
    reads: list[str] = []
    told: list[int] = []
    submitted: list[str] = []
    stopped: list[str] = []  # cancelled keys whose (cancelled) outcome is still to come
    steps: dict[str, int] = {}  # a running last step's reports made
    last_reported: dict[int, float] = {}
    trial = 0
    for _ in range(10_000):
        if rule.finished:
            break
        leaves = [k for k in running if k.startswith("fit-")]
        choices = (["propose"] if pending_asks else []) + (["outcome"] if running else []) + \
            (["read"] if reads else []) + (["report"] if leaves else []) + (["stopped"] if stopped else [])
        assert choices, "the search is stuck"
        what = rng.choice(choices)
        if what == "propose":
            pending_asks -= 1
            leaf = f"fit-{rng.randrange(3)}"
            out = rule.handle(Proposed(trial, ("load", leaf), f"m@{leaf}"))
            trial += 1
        elif what == "outcome":
            out = rule.handle(TaskFinished(running.pop(rng.randrange(len(running)))))
        elif what == "read":
            out = rule.handle(MetricRead(reads.pop(rng.randrange(len(reads))), rng.random()))
        elif what == "stopped":
            out = rule.handle(TaskFailed(stopped.pop(rng.randrange(len(stopped))), "CancelledError: stopped"))
        else:
            leaf = rng.choice(leaves)
            steps[leaf] = steps.get(leaf, -1) + 1
            out = rule.handle(Reported(leaf, steps[leaf], rng.random()))
        todo = list(out)
        while todo:
            ins = todo.pop(0)
            if isinstance(ins, Judge):
                last_reported[ins.trial] = ins.value
                todo.extend(rule.handle(Verdict(ins.trial, ins.step, rng.random() < prune_rate)))
            elif isinstance(ins, Cancel):
                for k in ins.names:
                    assert not any(k in (*r.tasks, r.metric) for r in rule.trials.values() if r.state is None)
                    running.remove(k)
                    if rng.random() < 0.7:
                        stopped.append(k)
            elif isinstance(ins, Tell) and ins.state == PRUNED:
                assert ins.value == last_reported.get(ins.trial)
                pending_asks += _follow([ins], running, submitted, reads, told)
            else:
                pending_asks += _follow([ins], running, submitted, reads, told)
        assert rule.asked <= n_trials
        assert len(rule.open) + rule.asking <= in_flight
    assert rule.finished
    assert sorted(told) == list(range(n_trials))
    assert len(submitted) == len(set(submitted))
