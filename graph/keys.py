"""Deterministic task keys: ``dask.tokenize`` over (function identity, parameters, input keys).

A function's identity is its module, qualified name *and* a digest of its code
(bytecode, constants, names, defaults and closure values, and the helper functions,
classes and plain constants of its own module that it reads), so editing a step's body
or a helper it calls changes its key while two processes that load the same code agree
on it.

>>> def double(x, factor=2):
...     return x * factor
>>> step_key(double, {"factor": 3}, ("load-abc",)) == step_key(double, {"factor": 3}, ("load-abc",))
True
>>> step_key(double, {"factor": 3}, ("load-abc",)).startswith("double-")
True

This module owns the key format both ways: :func:`step_name` reads a step's name off a
key, and :func:`recompute_key` / :func:`original_key` build and parse the distinct name a
released result is recomputed under (``<key>~again<N>``).

>>> step_name("double-3f2a9c"), step_name(recompute_key("double-3f2a9c", 2))
('double', 'double')
>>> original_key(recompute_key("double-3f2a9c", 2)), original_key("double-3f2a9c")
('double-3f2a9c', 'double-3f2a9c')
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .errors import PipelineError
from .spec import fn_name

__all__ = [
    "RECOMPUTE_MARK",
    "TokenizationError",
    "check_tokenizable",
    "function_identity",
    "identities_remembered",
    "metric_key",
    "original_key",
    "recompute_key",
    "step_key",
    "step_name",
]

#: what separates a key from the number of its recompute copy (``<key>~again<N>``)
RECOMPUTE_MARK = "~again"


def step_name(key: str) -> str:
    """The step (function) name a task key was made from: ``"<name>-<token>"`` -> ``name``
    (a recompute copy names its original's step; a Dask collection's partition key
    ``("<layer>-<token>", i, ...)`` names its layer's operation).

    >>> step_name(("fillna-3f2a9c", 4))
    'fillna'
    """
    key = original_key(key)
    if isinstance(key, tuple) and key and isinstance(key[0], str):
        key = key[0]
    return str(key).rsplit("-", 1)[0]


def recompute_key(key: str, n: int) -> str:
    """The distinct name under which a released result ``key`` is computed again (the ``n``-th copy);
    a partition key keeps its shape: ``(name, i)`` -> ``(name~againN, i)``.

    >>> recompute_key(("fillna-3f2a9c", 4), 1)
    ('fillna-3f2a9c~again1', 4)
    """
    if isinstance(key, tuple) and key and isinstance(key[0], str):
        return (f"{key[0]}{RECOMPUTE_MARK}{n}",) + key[1:]
    return f"{key}{RECOMPUTE_MARK}{n}"


def original_key(name: str) -> str:
    """The key a recompute copy stands for (``name`` itself when it is not a copy).

    >>> original_key(("fillna-3f2a9c~again1", 4))
    ('fillna-3f2a9c', 4)
    """
    if isinstance(name, str) and RECOMPUTE_MARK in name:
        return name.split(RECOMPUTE_MARK, 1)[0]
    if isinstance(name, tuple) and name and isinstance(name[0], str) and RECOMPUTE_MARK in name[0]:
        return (name[0].split(RECOMPUTE_MARK, 1)[0],) + name[1:]
    return name


def __getattr__(name: str) -> Any:  # Dask loads on first use: ``import graph`` stays Dask-free
    if name == "TokenizationError":
        from dask.tokenize import TokenizationError

        return TokenizationError
    raise AttributeError(f"module 'graph.keys' has no attribute {name!r}")


def _const_repr(const: Any) -> str:
    """A process-independent text for a code constant (frozensets are unordered: sort them)."""
    if isinstance(const, frozenset):
        return "frozenset(" + ",".join(sorted(_const_repr(c) for c in const)) + ")"
    if isinstance(const, tuple):
        return "(" + ",".join(_const_repr(c) for c in const) + ")"
    return repr((type(const).__name__, const))


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(_code_digest(const).encode())
        else:
            h.update(_const_repr(const).encode())
    return h.hexdigest()


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _globals_identity(fn: types.FunctionType, seen: set) -> tuple:
    """What ``fn`` reads from its module that its own code does not show: helper functions
    and classes of the same module (their code, recursively) and plain constants.  Editing a
    helper or a module-level constant therefore changes the step's key too.  Modules and
    objects from other modules are identified by name (a library's code is its version)."""
    out = []
    g = fn.__globals__
    for name in sorted(_names(fn.__code__)):
        if name not in g:
            continue
        v = g[name]
        if isinstance(v, _PLAIN) or (isinstance(v, (tuple, frozenset)) and all(isinstance(x, _PLAIN) for x in v)):
            out.append((name, _const_repr(v)))
        elif isinstance(v, types.FunctionType) and v.__module__ == fn.__module__:
            if id(v) not in seen:
                seen.add(id(v))
                out.append((name, _function_core(v, seen)))
        elif isinstance(v, type) and v.__module__ == fn.__module__ and id(v) not in seen:
            seen.add(id(v))
            methods = sorted(
                (k, _function_core(m, seen)) for k, m in vars(v).items() if isinstance(m, types.FunctionType)
            )
            out.append((name, tuple(methods)))
    return tuple(out)


def _function_core(fn: types.FunctionType, seen: set) -> tuple:
    seen.add(id(fn))
    return (fn.__module__, fn.__qualname__, _code_digest(fn.__code__), _globals_identity(fn, seen))


_memo: contextvars.ContextVar[dict | None] = contextvars.ContextVar("quiver_function_identities", default=None)


@contextlib.contextmanager
def identities_remembered() -> Iterator[None]:
    """While open (one compile), each function's identity is worked out once: a compile of a
    few hundred tasks asked again for the same few functions' code digests and globals on
    every task (half of a drop-in search's compile time).

    >>> def f(x): return x
    >>> with identities_remembered():
    ...     function_identity(f) is function_identity(f)
    True
    """
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def function_identity(fn: Callable) -> Any:
    """A value that tokenizes identically for the same code in any process.

    Raises ``TokenizationError`` when something the function closes over (or a
    callable object's state) has no deterministic token.
    """
    memo = _memo.get()
    if memo is None:
        return _function_identity(fn)
    found = memo.get(id(fn))
    if found is None or found[0] is not fn:
        found = memo[id(fn)] = (fn, _function_identity(fn))  # fn kept: its id is not reused meanwhile
    return found[1]


def _function_identity(fn: Callable) -> Any:
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
            _det(_globals_identity(fn, {id(fn)})),
            _det(fn.__defaults__),
            _det(fn.__kwdefaults__),
            _det(tuple(function_identity(c) if callable(c) else c for c in closure)),
        )
    call = getattr(type(fn), "__call__", None)
    if isinstance(call, types.FunctionType):  # a callable object: its state and its class's code
        return ("callable", _det(fn), function_identity(call))
    return ("callable", _det(fn))


def _det(obj: Any) -> str:
    from dask.tokenize import tokenize

    # the keyword, not ``dask.config.set``: entering a config context cost more than the token
    return tokenize(obj, ensure_deterministic=True)


def step_key(fn: Callable, params: Mapping[str, Any], inputs: tuple) -> str:
    """The key of one step instance: ``<function name>-<token>``."""
    from dask.tokenize import tokenize

    token = tokenize(function_identity(fn), dict(params), inputs, ensure_deterministic=True)
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
    from dask.tokenize import TokenizationError

    function = callable(obj) and not isinstance(obj, type)
    if function and _checked.get(id(obj)) is obj:  # this function passed already (an explore's alternatives share it)
        return
    try:
        if function:
            first, second = _det(_function_identity(obj)), _det(_function_identity(obj))  # asked twice: no memo
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
    if function:
        if len(_checked) >= _CHECKED_MAX:
            _checked.clear()
        _checked[id(obj)] = obj  # kept: its id is not reused while it is here


#: functions that passed :func:`check_tokenizable` (by id, the object kept). Checked once: a
#: grid's thousands of alternatives share one step function, whose identity (code digest,
#: globals, closure) was worked out twice per alternative. Should a global it reads later
#: become untokenizable, the compile's own key (``step_key``) refuses it with a clear error.
_checked: dict[int, Any] = {}
_CHECKED_MAX = 4096
