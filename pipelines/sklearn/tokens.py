"""Deterministic tokens for scikit-learn estimators, from ``get_params`` (not pickles).

Two estimators of the same class with the same parameters are the same work, whether or not
one was fitted before: a search clones every estimator it is given, so fitted state never
matters.  :class:`Est` wraps an estimator passed as a parameter so that Quiver's keys use
this token and its table shows the estimator's repr.

>>> from sklearn.decomposition import PCA
>>> estimator_token(PCA(5)) == estimator_token(PCA(5)), estimator_token(PCA(5)) == estimator_token(PCA(6))
(True, False)
>>> Est(PCA(5))
PCA(n_components=5)

One search asks for the same candidates' tokens many times (its plan, its keys, its table);
inside :func:`tokens_remembered` each object's token is worked out once (the objects are held,
so an ``id`` is never reused while the memo lives, and a search never changes them meanwhile):

>>> est = PCA(5)
>>> with tokens_remembered():
...     param_token(est) == param_token(est) == estimator_token(PCA(5))
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["estimator_token", "param_token", "tokens_remembered", "Est", "wrap", "unwrap"]

_local = threading.local()  # .memo: id -> (object, token) while tokens_remembered() is open in this thread


@contextlib.contextmanager
def tokens_remembered() -> Iterator[None]:
    """While open (in this thread), :func:`param_token` works each object's token out once."""
    outer = getattr(_local, "memo", None)
    if outer is None:
        _local.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _local.memo = None


def _is_estimator(obj: Any) -> bool:
    return hasattr(obj, "get_params") and not isinstance(obj, type)


def _normal(value: Any) -> Any:
    """A value dask tokenizes deterministically that stands for ``value`` as a parameter."""
    if isinstance(value, Est):
        value = value.estimator
    if _is_estimator(value):
        cls = type(value)
        params = value.get_params(deep=False)
        return ("sklearn-estimator", cls.__module__, cls.__qualname__, tuple((k, _normal(params[k])) for k in sorted(params)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_normal(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _normal(value[k])) for k in sorted(value, key=repr)))
    return value


def param_token(value: Any) -> str:
    """The deterministic token of a parameter value (estimators by class and ``get_params``)."""
    memo = getattr(_local, "memo", None)
    if memo is not None:
        hit = memo.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
    import dask
    from dask.tokenize import tokenize

    with dask.config.set({"tokenize.ensure-deterministic": True}):
        token = tokenize(_normal(value))
    if memo is not None:
        memo[id(value)] = (value, token)
    return token


def estimator_token(estimator: Any) -> str:
    """The deterministic token of an estimator: its class and ``get_params(deep=False)``, recursively."""
    return param_token(estimator)


class Est:
    """An estimator passed as a parameter: tokenized by :func:`estimator_token`, shown as its repr."""

    __slots__ = ("estimator",)

    def __init__(self, estimator: Any):
        self.estimator = estimator

    def __dask_tokenize__(self) -> Any:
        return ("Est", estimator_token(self.estimator))

    def __repr__(self) -> str:
        return repr(self.estimator)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Est) and estimator_token(self.estimator) == estimator_token(other.estimator)

    def __hash__(self) -> int:
        return hash(estimator_token(self.estimator))


def wrap(params: dict) -> dict:
    """``params`` with estimator values wrapped in :class:`Est` (for Quiver's keys and table)."""
    return {k: Est(v) if _is_estimator(v) else v for k, v in params.items()}


def unwrap(params: dict) -> dict:
    """The inverse of :func:`wrap`."""
    return {k: v.estimator if isinstance(v, Est) else v for k, v in params.items()}
