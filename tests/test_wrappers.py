"""graph.wrappers: the one rule for looking inside a step's wrappers, as its four readers use it
(the state machine's iterative check, the warm-up, the traceback restorer, the rerun rule)."""

from __future__ import annotations

import functools

from dask.task_spec import Task

from graph.tasks.iterative import Iterative
from graph.tasks.rerun import RunOnce, is_rerun_safe, not_rerunnable
from graph.tasks.shipping import ByValue
from graph.state.machine import runs_iterative
from graph.report.tracebacks import step_functions
from graph.compiling.transform import SaveResult
from graph.wrappers import innermost, layers


def fit(x, lr):
    yield {"score": x * lr}


@not_rerunnable
def side_effect(x):
    return x


class Holder:
    """A user's callable with an ``fn`` attribute: not one of Quiver's wrappers."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *a):
        return self.fn(*a)


def run_wrapped(fn):
    """As the compiler and executor nest them: the store's SaveResult over RunOnce over
    Iterative over ByValue over a partial."""
    return SaveResult(RunOnce(Iterative(ByValue(functools.partial(fn, lr=0.1))), "k", "run"), "/tmp/x", "k")


def test_layers_go_through_every_quiver_wrapper_and_partials_to_the_users_function():
    wrapped = run_wrapped(fit)
    kinds = [type(f).__name__ for f in layers(wrapped)]
    assert kinds == ["SaveResult", "RunOnce", "Iterative", "ByValue", "partial", "function"]
    assert innermost(wrapped) is fit


def test_a_users_own_callable_is_not_looked_inside():
    holder = Holder(fit)
    assert list(layers(holder)) == [holder] and innermost(holder) is holder


def test_the_state_machine_sees_an_iterative_step_under_the_runs_wrappers():
    assert runs_iterative(Task("k", run_wrapped(fit), 1))
    assert not runs_iterative(Task("k", SaveResult(ByValue(functools.partial(side_effect)), "/tmp/x", "k"), 1))


def test_the_rerun_rule_finds_a_mark_under_the_wrappers():
    assert not is_rerun_safe(run_wrapped(side_effect))
    assert is_rerun_safe(run_wrapped(fit))


def test_the_traceback_restorer_finds_the_users_function_under_the_wrappers():
    class Compiled:
        graph = {"k": Task("k", run_wrapped(fit), 1)}

    assert fit in step_functions(Compiled())
