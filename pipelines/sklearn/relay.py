"""Warnings raised on the workers, carried back and raised again in the caller.

scikit-learn's searches raise a fit's ``ConvergenceWarning``, a scorer's
``UndefinedMetricWarning`` or ``_score``'s "Scoring failed" in the process that called ``fit``.
On a cluster they happen in the workers, so each step records them (:func:`caught`), the
records travel with the fold's result to the candidate's table row (:func:`pack`: table
scalars hold short strings only, so the records are compressed and cut into pieces), and the
search raises them again in the caller (:func:`reemit`), once per (candidate, fold) that
met them, in scikit-learn's order, at their original module and line: the caller's warning
filters, and their "once per location" registries, apply as they do to scikit-learn's own.

>>> import warnings
>>> with caught() as records:
...     warnings.warn("careful", RuntimeWarning)
>>> records[0][:3]
('builtins', 'RuntimeWarning', 'careful')
>>> row = pack([[], records])
>>> sorted(k for k in row if not k.startswith(CHUNK))
['warnings']
>>> row["warnings"]
'RuntimeWarning on fold 1: careful'
>>> [(fold, r[2]) for fold, r in unpack(row)]
[(1, 'careful')]
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import sys
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

__all__ = ["caught", "pack", "unpack", "reemit", "summary", "CHUNK"]

#: the table scalars the packed records are cut into: ``_warnings0``, ``_warnings1``, ...
CHUNK = "_warnings"
_PIECE = 200  # the longest string a table scalar holds (graph/scalars.py)

Record = tuple  # (category module, category qualname, message, filename, lineno)


@contextlib.contextmanager
def caught() -> Iterator[list]:
    """Record every warning raised inside (each occurrence: filter ``always``), as plain
    tuples that pickle anywhere; nothing is shown on the worker."""
    records: list = []
    with warnings.catch_warnings(record=True) as raw:
        warnings.simplefilter("always")
        try:
            yield records
        finally:
            for w in raw:
                cat = w.category
                records.append((cat.__module__, cat.__qualname__, str(w.message), w.filename, w.lineno))


def summary(per_fold: list[list]) -> str:
    """A short text for the table: each distinct warning's class, the folds it met, its
    message's first line (at most 200 characters in all)."""
    seen: dict[tuple, list[int]] = {}
    for fold, records in enumerate(per_fold):
        for r in records:
            folds = seen.setdefault((r[1], r[2].strip().splitlines()[0] if r[2].strip() else ""), [])
            if fold not in folds:
                folds.append(fold)
    parts = [f"{cat} on fold{'s' if len(f) > 1 else ''} {','.join(map(str, f))}: {msg}" for (cat, msg), f in seen.items()]
    text = "; ".join(parts)
    return text if len(text) <= _PIECE else text[: _PIECE - 3] + "..."


def pack(per_fold: list[list]) -> dict[str, str]:
    """A candidate's records (one list per fold) as table scalars: ``warnings`` (the
    :func:`summary`) and the compressed records cut into ``_warnings<i>`` pieces.  No
    warnings: no scalars."""
    if not any(per_fold):
        return {}
    data = base64.b64encode(zlib.compress(json.dumps(per_fold).encode())).decode("ascii")
    out = {"warnings": summary(per_fold)}
    for i in range(0, len(data), _PIECE):
        out[f"{CHUNK}{i // _PIECE}"] = data[i : i + _PIECE]
    return out


def unpack(row: dict) -> list[tuple[int, Record]]:
    """``(fold, record)`` for every record of a table row made by :func:`pack`, fold order."""
    pieces = []
    i = 0
    while isinstance(row.get(f"{CHUNK}{i}"), str):
        pieces.append(row[f"{CHUNK}{i}"])
        i += 1
    if not pieces:
        return []
    per_fold = json.loads(zlib.decompress(base64.b64decode("".join(pieces))))
    return [(fold, tuple(r)) for fold, records in enumerate(per_fold) for r in records]


def _category(module: str, qualname: str) -> type[Warning]:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return UserWarning
    return obj if isinstance(obj, type) and issubclass(obj, Warning) else UserWarning


class _Modules:
    """filename -> (module name, its ``__warningregistry__``), for the modules loaded here."""

    def __init__(self) -> None:
        self.by_file: dict[str, tuple[str | None, dict | None]] = {}

    def __call__(self, filename: str) -> tuple[str | None, dict | None]:
        if not self.by_file:
            for name, mod in list(sys.modules.items()):
                path = getattr(mod, "__file__", None)
                if path:
                    self.by_file.setdefault(path, (name, None))
        name, _ = self.by_file.get(filename, (None, None))
        if name is None or name not in sys.modules:
            return None, None
        return name, vars(sys.modules[name]).setdefault("__warningregistry__", {})


def reemit(records: list[Record]) -> None:
    """Raise each record again here, at its original module and line."""
    modules = _Modules()
    for module, qualname, message, filename, lineno in records:
        name, registry = modules(filename)
        warnings.warn_explicit(message, _category(module, qualname), filename, lineno, module=name, registry=registry)
