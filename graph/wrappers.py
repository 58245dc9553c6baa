"""The one rule for looking inside a step's wrappers: a compiled task's callable is the user's
function under Quiver's wrappers (``graph``'s callables that keep it as ``.fn``: ``ByValue``,
``PlainStep``, ``Iterative``, ``SaveResult``, ``RunOnce``) and ``functools.partial``.

Pure: imports nothing from the project, so the state machine, the warm-up, the traceback
restorer and the rerun rule all read a task the same way.

>>> import functools
>>> def fit(x, lr): return x * lr
>>> p = functools.partial(fit, lr=0.1)
>>> [getattr(f, "__name__", "partial") for f in layers(p)]
['partial', 'fit']
>>> innermost(p) is fit, innermost(None) is None
(True, True)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

__all__ = ["innermost", "layers"]

#: deeper than any real nesting (a store's SaveResult over RunOnce over Iterative over ByValue
#: over a partial): a bound, so an object that wraps itself cannot loop for ever
_MOST = 16


def _inner(obj: Any) -> Any:
    if isinstance(obj, functools.partial):
        return obj.func
    if type(obj).__module__.startswith("graph.") and hasattr(obj, "fn"):
        return obj.fn
    return None


def layers(fn: Any) -> Iterator[Any]:
    """``fn``, then each callable it wraps, outermost first (``None`` yields nothing)."""
    for _ in range(_MOST):
        if fn is None:
            return
        yield fn
        inner = _inner(fn)
        if inner is fn:
            return
        fn = inner


def innermost(fn: Any) -> Any:
    """The user's function inside ``fn``'s wrappers (``fn`` itself when it wraps nothing)."""
    last = fn
    for last in layers(fn):
        pass
    return last
