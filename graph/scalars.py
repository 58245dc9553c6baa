"""The small scalar entries of a step's output (numbers, booleans, short strings): what the
table shows for every branch and what an iterative step's report carries, without moving
the rest of the value.  Imports nothing from Dask.

>>> scalar_entries({"accuracy": 0.9, "model": object(), "name": "mlp"})
{'accuracy': 0.9, 'name': 'mlp'}
>>> scalar_entries([1, 2])
{}
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["scalar_entries"]


def scalar_entries(value: Any) -> dict[str, Any]:
    """The small scalar entries (numbers, booleans, short strings) of a mapping output."""
    out: dict[str, Any] = {}
    if not isinstance(value, Mapping):
        return out
    for k, v in value.items():
        if hasattr(v, "item") and getattr(v, "shape", None) == ():
            v = v.item()  # numpy / torch scalars
        if isinstance(k, str) and isinstance(v, (numbers.Number, str)) and not isinstance(v, complex):
            if not isinstance(v, str) or len(v) <= 200:
                out[k] = v
    return out
