"""graph/compiling/tokencache.py: while a run compiles, each function's Dask token is computed once, and
every key stays what Dask alone makes it."""

from __future__ import annotations

import contextlib
import types
from collections import Counter

import dask.tokenize as dask_tokenize
import pytest
from dask.base import tokenize

import graph.compiling.compiler
from graph.compiling.tokencache import function_tokens_once
from tests import collection_steps as cs
from tests.test_collections import exploration


def _script_function(source: str, name: str, **globals_):
    """A function as a script or notebook defines it: in ``__main__``, so Dask pickles it by value."""
    namespace = {"__name__": "__main__", **globals_}
    exec(compile(source, "<script>", "exec"), namespace)  # noqa: S102 - the test's own literal code
    return namespace[name]


def test_a_scripts_function_keeps_dasks_token_and_is_pickled_once(monkeypatch):
    scale = _script_function("def scale(x):\n    return x * FACTOR\n", "scale", FACTOR=2)
    plain = tokenize(scale)
    pickled = Counter()
    real = dask_tokenize._normalize_pickle
    monkeypatch.setattr(dask_tokenize, "_normalize_pickle", lambda o: pickled.update([id(o)]) or real(o))
    with function_tokens_once():
        tokens = {tokenize(scale), tokenize(scale, 1), tokenize([scale, scale])}
        assert pickled[id(scale)] == 1
    assert tokenize(scale) in tokens and plain in tokens
    assert pickled[id(scale)] == 2  # closed: Dask's own normaliser again


def test_a_changed_global_changes_the_token_in_the_next_compile():
    scale = _script_function("def scale(x):\n    return x * FACTOR\n", "scale", FACTOR=2)
    with function_tokens_once():
        before = tokenize(scale)
    scale.__globals__["FACTOR"] = 3  # a notebook cell edited between two runs
    with function_tokens_once():
        after = tokenize(scale)
    assert before != after


def test_dasks_dispatch_table_is_left_as_it_was_nested_and_on_error():
    lookup = dask_tokenize.normalize_token._lookup
    had, own = types.FunctionType in lookup, lookup.get(types.FunctionType)
    with pytest.raises(RuntimeError), function_tokens_once():
        with function_tokens_once():
            assert lookup[types.FunctionType] is not own
        assert lookup[types.FunctionType] is not own  # the outer one is still open
        raise RuntimeError("a compile error")
    assert (types.FunctionType in lookup) == had and lookup.get(types.FunctionType) is own


def test_compiling_a_collection_exploration_normalises_each_function_once_with_the_same_keys(files, monkeypatch):
    def compile_counting():
        seen = Counter()
        real = dask_tokenize._normalize_pickle

        def counting(o):
            if isinstance(o, types.FunctionType):
                seen[o.__qualname__] += 1
            return real(o)

        monkeypatch.setattr(dask_tokenize, "_normalize_pickle", counting)
        try:
            return exploration(files).compile(), seen
        finally:
            monkeypatch.setattr(dask_tokenize, "_normalize_pickle", real)

    memo, once = compile_counting()
    monkeypatch.setattr(graph.compiling.compiler, "function_tokens_once", contextlib.nullcontext)
    bare, again = compile_counting()
    assert sorted(map(str, memo.graph)) == sorted(map(str, bare.graph))
    assert [b.key for b in memo.branches] == [b.key for b in bare.branches]
    assert once and max(once.values()) == 1, once
    assert max(again.values()) > 1, again  # without the memo Dask pickles a step function again and again


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return cs.write_table(tmp_path_factory.mktemp("table"), parts=4, rows=500)
