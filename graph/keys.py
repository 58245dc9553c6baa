"""Deterministic task keys: ``dask.tokenize`` over (function identity, parameters, input keys).

A function's identity is its module, qualified name *and* a digest of its code
(bytecode, constants, names, defaults and closure values), so editing a step's body
changes its key while two processes that load the same code agree on it.

>>> def double(x, factor=2):
...     return x * factor
>>> step_key(double, {"factor": 3}, ("load-abc",)) == step_key(double, {"factor": 3}, ("load-abc",))
True
>>> step_key(double, {"factor": 3}, ("load-abc",)).startswith("double-")
True
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import dask
from dask.tokenize import TokenizationError, tokenize

from .errors import PipelineError
from .spec import fn_name

__all__ = ["function_identity", "step_key", "metric_key", "check_tokenizable", "TokenizationError"]


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(_code_digest(const).encode())
        else:
            h.update(repr((type(const).__name__, const)).encode())
    return h.hexdigest()


def function_identity(fn: Callable) -> Any:
    """A value that tokenizes identically for the same code in any process.

    Raises ``TokenizationError`` when something the function closes over (or a
    callable object's state) has no deterministic token.
    """
    if isinstance(fn, functools.partial):
        return ("partial", function_identity(fn.func), _det(fn.args), _det(fn.keywords))
    if isinstance(fn, types.MethodType):
        return ("method", function_identity(fn.__func__), _det(fn.__self__))
    if isinstance(fn, types.FunctionType):
        closure = tuple(c.cell_contents for c in (fn.__closure__ or ()))
        return (
            "function",
            fn.__module__,
            fn.__qualname__,
            _code_digest(fn.__code__),
            _det(fn.__defaults__),
            _det(fn.__kwdefaults__),
            _det(tuple(function_identity(c) if callable(c) else c for c in closure)),
        )
    return ("callable", _det(fn))


def _det(obj: Any) -> str:
    with dask.config.set({"tokenize.ensure-deterministic": True}):
        return tokenize(obj)


def step_key(fn: Callable, params: Mapping[str, Any], inputs: tuple) -> str:
    """The key of one step instance: ``<function name>-<token>``."""
    with dask.config.set({"tokenize.ensure-deterministic": True}):
        token = tokenize(function_identity(fn), dict(params), inputs)
    return f"{fn_name(fn)}-{token}"


def metric_key(metric: Any, value_key: str) -> str:
    """The key of the small task that reads a choose metric off a branch's value."""
    ident = function_identity(metric) if callable(metric) else ("item", metric)
    return f"metric-{_det((ident, value_key))}"


def check_tokenizable(where: str, what: str, obj: Any) -> None:
    """Raise ``PipelineError`` if ``obj`` has no deterministic token.

    >>> check_tokenizable("pipeline 'p', source(load)", "parameter 'seed'", 3)
    >>> check_tokenizable("pipeline 'p', source(load)", "parameter 'x'", object())
    Traceback (most recent call last):
        ...
    graph.errors.PipelineError: pipeline 'p', source(load): parameter 'x' (object) has no deterministic token, ...
    """
    try:
        if callable(obj) and not isinstance(obj, type):
            first, second = _det(function_identity(obj)), _det(function_identity(obj))
        else:
            first, second = _det(obj), _det(obj)
    except TokenizationError as exc:
        raise PipelineError(
            f"{where}: {what} ({type(obj).__name__}) has no deterministic token, so identical "
            "work could not be recognised across branches or processes. Pass plain values "
            "(numbers, strings, tuples, dicts, numpy/pandas objects, dataclasses), or give the "
            f"object a __dask_tokenize__ method that returns a stable value. ({exc})"
        ) from None
    if first != second:  # e.g. a __dask_tokenize__ that returns a fresh value each time
        raise PipelineError(
            f"{where}: {what} ({type(obj).__name__}) tokenizes differently each time it is asked "
            "(its __dask_tokenize__ or state is not stable), so its step would get a new key on "
            "every run and identical work could not be recognised. Make __dask_tokenize__ "
            "return a value that depends only on the object's content."
        )
