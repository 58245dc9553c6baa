"""Machine-readable output of a run (``quiver run --json``): strict JSON, one object per branch.

* Strict JSON: ``NaN`` and infinities become ``null`` (``JSON.parse`` and every strict parser
  reject bare ``NaN``); NumPy scalars become plain numbers; anything else without a JSON form
  becomes its ``str``.
* Every row carries ``branch`` (its row number in ``result.table``).
* Parameters: a row has a ``"<explore>.<param>"`` entry only for the parameters of the
  alternative it took, with the value the step received (``max_depth=None`` is ``null``; an
  integer stays an integer); a parameter that does not apply to the branch is absent, never
  ``null``. A value without a JSON form (a callable, a ``functools.partial``, a ``gpu.Loop``)
  is its short text (:func:`graph.labels.value_text`: ``make_net(64)``), never a ``repr`` with
  a memory address.
* ``label``: the branch's choices that differ from the other branches' (``width=64 lr=0.01``,
  the table's ``label`` column, :func:`graph.labels.branch_labels`).
* A run with iterative steps (docs/architecture.md §7): each row has ``iterations`` (a table
  column) and ``history``, the list of its reports (``Result.history``).
* Failed runs too: ``{"error": message, "table": [...every branch, with its error...], ...}``.

>>> strict({"a": float("nan"), "b": [1.5, float("inf")], "c": None})
{'a': None, 'b': [1.5, None], 'c': None}
>>> import pandas as pd
>>> t = pd.DataFrame({"m": ["a", "b"], "m.depth": [3.0, float("nan")], "score": [0.5, float("nan")]})
>>> rows = table_records(t, params=[{"m.depth": 3}, {"m.depth": None}])
>>> rows[1]
{'branch': 1, 'm': 'b', 'm.depth': None, 'score': None}
>>> table_records(t, params=[{"m.depth": 3}, {}])[1]
{'branch': 1, 'm': 'b', 'score': None}
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["strict", "table_records", "branch_params", "payload", "write_json"]


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` and NumPy scalars made plain."""
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        value = value.item()  # a NumPy scalar
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else None
    try:
        import pandas as pd

        if value is pd.NaT or value is pd.NA:
            return None
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    return value


def branch_params(compiled: Any) -> list[dict[str, Any]] | None:
    """Per branch, the parameters of the alternatives it took: ``{"<explore>.<param>": value}``."""
    if compiled is None:
        return None
    from graph.labels import plain_value

    out = []
    for b in compiled.branches:
        row = {}
        for name, _label, params in b.choice_items:
            for p, v in params:
                row[f"{name}.{p}"] = plain_value(v)
        out.append(row)
    return out


def table_records(table: Any, params: list[dict[str, Any]] | None = None, *, tracebacks: bool = False) -> list[dict]:
    """The table's rows as JSON-ready dicts, each with its ``branch`` number.

    ``params`` (from :func:`branch_params`): each row's own parameters, which replace the
    table's parameter columns (there, pandas shows both a ``None`` parameter and one that
    does not apply as ``NaN``).  A table with ``attrs["history"]`` (a run with iterative
    steps) gives each row its ``history`` (its reports, a list of dicts)."""
    if table is None:
        return []
    param_cols = {c for c in table.columns if "." in c and c.split(".", 1)[0] in table.columns}
    history = table.attrs.get("history")  # iterative steps' reports per row (Result.history)
    rows = []
    for n, (i, rec) in enumerate(table.iterrows()):
        row: dict[str, Any] = {"branch": int(i) if isinstance(i, numbers.Integral) else i}
        for col, v in rec.items():
            if col == "traceback" and not (tracebacks or rec.get("status") == "failed"):
                continue  # a failed branch keeps its traceback, in a finished run too
            if col in param_cols and params is not None:
                if col in params[n]:
                    row[col] = params[n][col]
                continue
            row[col] = v
        if history is not None:
            row["history"] = history[n]
        rows.append(strict(row))
    return rows


def payload(table: Any, stats: Mapping | None = None, *, compiled: Any = None, error: str | None = None) -> dict:
    """What ``--json`` writes: ``table`` (rows), ``stats``, and for a failed run ``error``."""
    failed = error is not None
    out: dict[str, Any] = {"ok": not failed}
    if failed:
        out["error"] = error
    out["table"] = table_records(table, branch_params(compiled) if table is not None else None, tracebacks=failed)
    out["stats"] = strict(dict(stats or {}))
    return out


def write_json(path: str | Path, data: Mapping) -> None:
    """Write ``data`` as strict JSON (refusing ``NaN``, which :func:`strict` already replaced)."""
    Path(path).write_text(json.dumps(strict(data), indent=2, allow_nan=False, default=str))
