"""How a branch is named to the user: by its choices, never by an object's ``repr``.

The one rule behind every label a user reads: ``Result.table``'s ``label`` and parameter
columns, ``quiver run --json``, the report, and the dashboard's legends, hovers and tables.

* :func:`value_text`: a parameter value as short, stable text (the same in every process, no
  memory address): numbers and strings as written, a function or class by its name, a
  ``functools.partial`` as its function's name with the bound arguments (``make_net(64)``), a
  dataclass (``gpu.Loop``) by its class and the fields that differ from their defaults, an
  object whose ``repr`` carries an address by its class name.
* :func:`choice_text`: one choice, ``fit(C=1, kernel=rbf)``.
* :func:`branch_labels`: per branch of a run, its explore choices and the parameter values that
  *differ* between the run's branches, ``width=64 lr=0.01``; what every branch shares is left
  out (a one-branch run shows all its choices).

>>> import functools
>>> def make_net(width, depth=2): ...
>>> value_text(functools.partial(make_net, 64)), value_text(functools.partial(make_net, 64, depth=3))
('make_net(64)', 'make_net(64, depth=3)')
>>> value_text(0.01), value_text(3), value_text(None), value_text("rbf"), value_text([16, 32])
('0.01', '3', 'None', 'rbf', '[16, 32]')
>>> branch_labels([
...     [("t", "train_loop", {"width": 64, "lr": 0.01, "epochs": 3})],
...     [("t", "train_loop", {"width": 32, "lr": 0.01, "epochs": 3})]])
['width=64', 'width=32']
>>> branch_labels([[("model", "svc", {"C": 1})], [("model", "svc", {"C": 10})],
...                 [("model", "tree", {"max_depth": None})], [("model", "tree", {"max_depth": 3})]])
['model=svc C=1', 'model=svc C=10', 'model=tree max_depth=None', 'model=tree max_depth=3']
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .spec import fn_name

logger = logging.getLogger(__name__)

__all__ = ["MAX_TEXT", "value_text", "choice_text", "branch_labels", "plain_value"]

#: the longest text :func:`value_text` gives a value; past it a value shows by its type's name
MAX_TEXT = 60

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def _number(value: Any) -> Any:
    """A NumPy scalar as a plain Python number (anything else unchanged)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def plain_value(value: Any) -> Any:
    """``value`` itself when it is plain data a table or JSON shows as it is (``None``, a bool,
    a number, a string; a list, tuple or dict of those), else its :func:`value_text`.

    >>> import functools
    >>> plain_value(3), plain_value(None), plain_value(functools.partial(max, 1)), plain_value(("a", [1, max]))
    (3, None, 'max(1)', ('a', [1, 'max']))
    """
    return _plain(value, 0)


def _plain(value: Any, depth: int) -> Any:
    value = _number(value)
    if value is None or isinstance(value, (bool, str, numbers.Number)):
        return value
    if depth < 4 and type(value) in (list, tuple):  # a container of plain values stays one
        return type(value)(_plain(v, depth + 1) for v in value)
    if depth < 4 and type(value) is dict:
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    return value_text(value)


def value_text(value: Any, depth: int = 0) -> str:
    """``value`` as short, stable text (see the module's text); never a memory address.

    >>> class Opaque: pass
    >>> value_text(Opaque()), value_text(lambda x: x), value_text(1e-05), value_text(True)
    ('Opaque', 'lambda', '1e-05', 'True')
    """
    value = _number(value)
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if depth > 3:
        return type(value).__name__
    if isinstance(value, functools.partial):
        args = [value_text(a, depth + 1) for a in value.args]
        args += [f"{k}={value_text(v, depth + 1)}" for k, v in value.keywords.items()]
        return _short(f"{value_text(value.func, depth + 1)}({', '.join(args)})", value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _short(_dataclass_text(value, depth), value)
    if callable(value) and (hasattr(value, "__name__") or isinstance(value, type)):
        return fn_name(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(value_text(v, depth + 1) for v in value)
        text = f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        return _short(text, value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{value_text(k, depth + 1)}: {value_text(v, depth + 1)}" for k, v in value.items())
        return _short("{" + inner + "}", value)
    try:
        text = repr(value)
    except Exception as exc:  # recorded: a broken __repr__; the type still names it
        logger.debug("a label shows %s by its type: its repr failed (%r)", type(value).__name__, exc)
        return type(value).__name__
    return _short(text, value)


def _short(text: str, value: Any) -> str:
    """``text``, or the value's type name when ``text`` is long or holds a memory address."""
    if len(text) > MAX_TEXT or _ADDRESS.search(text) or "\n" in text:
        return fn_name(value) if callable(value) else type(value).__name__
    return text


def _dataclass_text(value: Any, depth: int) -> str:
    """``Loop(model=make_net(64))``: the class and the fields that differ from their defaults."""
    parts = []
    for f in dataclasses.fields(value):
        if not f.repr:
            continue
        v = getattr(value, f.name, None)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                default = f.default_factory()
            except Exception as exc:  # recorded: a factory that needs context; the field counts as set
                logger.debug("label: default of %s.%s not made (%r)", type(value).__name__, f.name, exc)
                default = dataclasses.MISSING
        else:
            default = dataclasses.MISSING
        try:
            same = default is not dataclasses.MISSING and (v is default or bool(v == default))
        except Exception as exc:  # recorded: an array-like ``==``; not a plain default
            logger.debug("label: %s.%s compared to its default failed (%r)", type(value).__name__, f.name, exc)
            same = False
        if not same:
            parts.append(f"{f.name}={value_text(v, depth + 1)}")
    return f"{type(value).__name__}({', '.join(parts)})"


def choice_text(label: str, params: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> str:
    """One choice as the user wrote it: ``fit(C=1, kernel=rbf)``; ``fit`` without parameters.

    >>> choice_text("fit", {"C": 1, "kernel": "rbf"}), choice_text("pca", ())
    ('fit(C=1, kernel=rbf)', 'pca')
    """
    items = params.items() if isinstance(params, Mapping) else params
    inner = ", ".join(f"{k}={value_text(v)}" for k, v in items)
    return f"{label}({inner})" if inner else str(label)


_ABSENT = object()


def branch_labels(branches: Sequence[Iterable[tuple[str, str, Any]]]) -> list[str]:
    """Per branch, ``"name=alternative p=value ..."``: each explore whose alternative differs
    between the branches (``name=label``), then each parameter whose value differs between the
    branches that took the same alternative (``p=value``; ``explore.p=value`` when two explores
    share a parameter name), in the branch's own order. A branch whose choices all match every
    other branch's (a one-branch run) shows all of them. ``branches``: per branch, ``(explore name, alternative
    label, parameters)`` triples (parameters a mapping or ``(name, value)`` pairs), as
    ``Branch.choice_items`` holds them.

    >>> branch_labels([[("a", "add", {"n": 1}), ("s", "fit", {"C": 1})], [("a", "add", {"n": 2}), ("s", "fit", {"C": 1})]])
    ['n=1', 'n=2']
    >>> branch_labels([[("a", "add", {"n": 1}), ("b", "mul", {"n": 2})], [("a", "add", {"n": 3}), ("b", "mul", {"n": 2})]])
    ['a.n=1', 'a.n=3']
    >>> branch_labels([[("fit", "fit", {"lr": 0.1})]])
    ['fit=fit lr=0.1']
    """
    rows: list[list[tuple[str, str, list[tuple[str, str]]]]] = []
    for choices in branches:
        row = []
        for name, label, params in choices:
            items = params.items() if isinstance(params, Mapping) else params
            row.append((str(name), str(label), [(str(p), value_text(v)) for p, v in items]))
        rows.append(row)
    present = [_slots_of(row) for row in rows]
    slots: dict[tuple, set] = {}  # (explore,) or (explore, alternative, param) -> the texts shown
    for row in rows:
        for name, label, params in row:
            slots.setdefault((name,), set()).add(label)
            for p, text in params:
                slots.setdefault((name, label, p), set()).add(text)
    for slot, texts in slots.items():  # branches that lack it (of those that took its alternative)
        if any(slot[:2] in mine and slot not in mine if len(slot) == 3 else slot not in mine for mine in present):
            texts.add(_ABSENT)
    differ = {slot for slot, texts in slots.items() if len(texts) > 1}
    owners: dict[str, set] = {}
    for slot in slots:
        if len(slot) == 3:
            owners.setdefault(slot[2], set()).add(slot[0])
    out = []
    for row, mine in zip(rows, present):
        parts = []
        everything = not (mine & differ)
        for name, label, params in row:
            if everything or (name,) in differ:
                parts.append(f"{name}={label}")
            for p, text in params:
                if everything or (name, label, p) in differ:
                    key = p if len(owners.get(p, ())) == 1 else f"{name}.{p}"
                    parts.append(f"{key}={text}")
        out.append(" ".join(parts))
    return out


def _slots_of(row: list) -> set:
    found = set()
    for name, label, params in row:
        found.update({(name,), (name, label)})
        found.update((name, label, p) for p, _ in params)
    return found
