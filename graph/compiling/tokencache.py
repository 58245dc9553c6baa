"""Each function tokenized once while a run compiles (Dask's tokens, unchanged, made faster).

``dask.tokenize`` pickles a plain function every time it meets one (dask 2026.7: a function has
no normaliser of its own, so ``normalize_object`` pickles it; a script's or notebook's own
functions are not importable by the workers, so they go by value through cloudpickle, ~1 ms
each). Collections tokenize their expressions again each time dask-expr lowers them, and a
collection step's functions sit in every expression above them: compiling
``examples/big_table_explore.py``'s 27 branches as a script pickled its ``_solved`` helper
1,134 times, 2.0 of the compile's 3.6 s. One ``dask.compute`` of the same branches pays less of
that, so a user's first script was slower with Quiver than with Dask alone.

:func:`function_tokens_once` puts a memo in front of Dask's normaliser for functions while it is
open: the first token of each function object is kept (with the object, so its ``id`` is not
reused) and returned for it again; the tokens are the ones Dask computes, so every key stays as
it was. The memo lives only while the context is open (one compile): a function whose globals
change between runs (a notebook's edited constant) is tokenized afresh next time, as Dask does.

>>> from dask.base import tokenize
>>> def scale(x):
...     return x * 2
>>> plain = tokenize(scale)
>>> with function_tokens_once():
...     once = tokenize(scale), tokenize(scale)
>>> once == (plain, plain)
True
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dask.tokenize import normalize_token

__all__ = ["function_tokens_once"]

_lock = threading.Lock()
_open = 0  # contexts open (nested compiles and threads share one memo)
_memo: dict[int, tuple[Any, Any]] = {}  # id(function) -> (the function, its normalised token)
_normalise: Callable[[Any], Any] | None = None  # Dask's normaliser for functions, wrapped by _memoized


def _memoized(fn: Any) -> Any:
    hit = _memo.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    normalise = _normalise
    if normalise is None:  # closed meanwhile (another thread dispatched here just before): Dask's own
        from dask.tokenize import normalize_object

        return normalize_object(fn)
    out = normalise(fn)
    _memo[id(fn)] = (fn, out)
    return out


@contextmanager
def function_tokens_once() -> Iterator[None]:
    """While open, each plain function's token is computed once (see the module docstring).

    Dask's public ``normalize_token.register`` puts the memo in front for ``FunctionType`` and,
    at the close, gives the type back the normaliser Dask's dispatch found for it (what its
    dispatch caches for the type itself after its first function)."""
    global _open, _normalise
    with _lock:
        if _open == 0:
            _memo.clear()  # a token another thread stored as the last compile closed is not reused
            _normalise = normalize_token.dispatch(types.FunctionType)  # Dask's (or a user's) normaliser
            normalize_token.register(types.FunctionType, _memoized)
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                normalize_token.register(types.FunctionType, _normalise)
                _memo.clear()
                _normalise = None
