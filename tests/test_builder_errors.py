"""Malformed definitions raise PipelineError at build time, naming the node and the fix."""

from __future__ import annotations

import threading

import pytest

from pipelines import Pipeline, PipelineError, combine, grid
from tests import steps


@pytest.fixture
def src():
    return Pipeline("errs").source(steps.source, seed=1)


def test_unknown_metric_mode(src):
    node = src.explore("a", grid(steps.add, n=[1, 2]))
    with pytest.raises(PipelineError, match=r"pipeline 'errs'.*choose\('x'\).*unknown mode 'maximum'.*mode='max'"):
        node.choose("x", mode="maximum")


def test_duplicate_explore_name_on_one_path(src):
    node = src.explore("a", grid(steps.add, n=[1, 2]))
    with pytest.raises(PipelineError, match=r"explore\('a'\).*already upstream.*another name"):
        node.then(steps.square).explore("a", grid(steps.mul, n=[2]))


def test_duplicate_explore_name_through_combine(src):
    a = src.explore("a", grid(steps.add, n=[1, 2]))
    both = combine(steps.join, left=a, right=src)
    with pytest.raises(PipelineError, match="already upstream"):
        both.explore("a", grid(steps.mul, n=[2]))


def test_empty_grid(src):
    with pytest.raises(PipelineError, match=r"explore\('a'\).*list for 'n' is empty.*at least one value"):
        src.explore("a", grid(steps.add, n=[]))


def test_grid_value_not_a_list(src):
    with pytest.raises(PipelineError, match=r"'n' must be a list of values.*n=\[3\]"):
        src.explore("a", grid(steps.add, n=3))


def test_non_callable_alternative(src):
    with pytest.raises(PipelineError, match=r"explore\('a'\): alternative 'b' is a str.*not a callable"):
        src.explore("a", b="add")
    with pytest.raises(PipelineError, match=r"alternative #2 is a int"):
        src.explore("a", steps.square, 3)


def test_no_alternatives(src):
    with pytest.raises(PipelineError, match="nothing to explore"):
        src.explore("a")


def test_choose_without_explore(src):
    with pytest.raises(PipelineError, match=r"choose\('x'\).*nothing is explored upstream.*Add an explore"):
        src.then(steps.square).choose("x")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"k": 0}, "k must be a whole number >= 1"),
        ({"k": 1.5}, "k must be a whole number >= 1"),
        ({"threshold": "high"}, "threshold must be a real number"),
        ({"threshold": float("nan")}, "threshold must be a real number"),
        ({"per": "nope"}, r"per='nope' is not an explore upstream.*\['a'\]"),
    ],
)
def test_bad_choose_arguments(src, kwargs, pattern):
    node = src.explore("a", grid(steps.add, n=[1, 2]))
    with pytest.raises(PipelineError, match=pattern):
        node.choose("x", **kwargs)


def test_metric_must_be_key_or_callable(src):
    with pytest.raises(PipelineError, match="metric must be a key"):
        src.explore("a", grid(steps.add, n=[1, 2])).choose(3)


def test_wrong_parameter_name_caught_at_build_time(src):
    with pytest.raises(PipelineError, match=r"explore\('a'\), alternative 'add'.*cannot be called.*with m=1: missing a required argument: 'n'"):
        src.explore("a", grid(steps.add, m=[1]))
    with pytest.raises(PipelineError, match=r"then\(square\).*cannot be called"):
        src.then(steps.square, power=2)
    with pytest.raises(PipelineError, match=r"source\(source\).*cannot be called"):
        Pipeline("errs").source(steps.source, speed=2)


def test_combine_checks_input_names(src):
    with pytest.raises(PipelineError, match=r"combine\(join\).*cannot be called"):
        combine(steps.join, left=src, other=src)


def test_step_must_be_callable(src):
    with pytest.raises(PipelineError, match="the step must be a callable"):
        src.then("square")


def test_ambiguous_alternatives(src):
    with pytest.raises(PipelineError, match=r"alternatives #1 and #2 are both labelled 'square'.*Name them"):
        src.explore("a", steps.square, steps.square)


def test_non_deterministic_parameter_is_refused_at_build_time(src):
    with pytest.raises(PipelineError, match=r"parameter 'n'.*no deterministic token.*__dask_tokenize__"):
        src.then(steps.add, n=object())
    with pytest.raises(PipelineError, match="no deterministic token"):
        src.then(steps.add, n=threading.Lock())


def test_explore_name_must_be_text(src):
    with pytest.raises(PipelineError, match="explore name must be a non-empty string"):
        src.explore("", steps.square)


def test_building_runs_nothing(log_dir):
    node = (
        Pipeline("lazy")
        .source(steps.source, seed=1, log=log_dir)
        .explore("a", grid(steps.add, n=[1, 2], log=[log_dir]))
        .choose("x")
    )
    node.compile()
    assert steps.executions(log_dir) == []


def test_nodes_are_immutable(src):
    a = src.explore("a", grid(steps.add, n=[1, 2]))
    b = a.then(steps.square)
    assert a.compile().unique_tasks == 3
    assert b.compile().unique_tasks == 5
    with pytest.raises(AttributeError):
        a.spec = b.spec
