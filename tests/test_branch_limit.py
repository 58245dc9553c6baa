"""``graph.spec.branch_limit``: the parser, and its doctest, which must check the parser whatever
``QUIVER_BRANCH_LIMIT`` holds in the test's own environment (it once passed vacuously when it was set)."""

from __future__ import annotations

import doctest

import pytest

import graph.spec as spec


def run_doctest(fn) -> doctest.TestResults:
    test = doctest.DocTestFinder().find(spec.branch_limit, "branch_limit", globs=dict(vars(spec), branch_limit=fn))[0]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=lambda _text: None)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("env", ["7", "none", ""])
def test_doctest_passes_whatever_the_environment(monkeypatch, env):
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", env)
    result = run_doctest(spec.branch_limit)
    assert result.attempted >= 2 and result.failed == 0


@pytest.mark.parametrize("env", ["7", "none"])
def test_doctest_catches_a_wrong_parser_even_when_the_variable_is_set(monkeypatch, env):
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", env)
    assert run_doctest(lambda environ=None: 12345).failed > 0


@pytest.mark.parametrize(
    "raw, limit",
    [(None, spec.BRANCH_LIMIT), ("", spec.BRANCH_LIMIT), ("500", 500), ("1_000", 1000), ("2e3", 2000),
     ("0", None), ("none", None), ("OFF", None), ("-3", None)],
)
def test_parser_reads_the_given_environment(raw, limit):
    assert spec.branch_limit({} if raw is None else {"QUIVER_BRANCH_LIMIT": raw}) == limit


def test_default_environment_is_the_process_environment(monkeypatch):
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", "42")
    assert spec.branch_limit() == 42


def test_malformed_value_names_the_variable():
    with pytest.raises(ValueError, match="QUIVER_BRANCH_LIMIT must be a whole number"):
        spec.branch_limit({"QUIVER_BRANCH_LIMIT": "lots"})
