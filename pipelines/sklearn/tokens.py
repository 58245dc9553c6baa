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
"""

from __future__ import annotations

from typing import Any

__all__ = ["estimator_token", "param_token", "Est", "wrap", "unwrap"]


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
    import dask
    from dask.tokenize import tokenize

    with dask.config.set({"tokenize.ensure-deterministic": True}):
        return tokenize(_normal(value))


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
