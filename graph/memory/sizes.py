"""Byte sizes: parsing budgets, and estimating how big each intermediate will be.

Estimates come, best first, from sizes measured on the cluster (``dask.sizeof``
of real results, as the scheduler records them), from a user's ``size_hint`` on
a step, from a measured sibling (another task of the same step, e.g. a different
alternative's output of the same explore), and finally from a default.  Each
estimate remembers where it came from, so a plan can say how much it guessed.

>>> parse_bytes("2 GiB"), parse_bytes(1000), parse_bytes("1.5kB")
(2147483648, 1000, 1500)
>>> est = SizeEstimates(hints={"scale-1": 800}, default=100)
>>> est.update({"scale-2": 1200})
>>> est.get("scale-1"), est.get("scale-2"), est.get("scale-3"), est.get("load-9")
(800, 1200, 1200, 100)
>>> est.source("scale-3")
'sibling'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SizeEstimates", "parse_bytes", "format_bytes", "step_of"]


def parse_bytes(value: Any, what: str = "memory budget") -> int:
    """``"2 GiB"``, ``"500MB"`` or a number of bytes, as an int; a clear error otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of bytes or a string like '2 GiB', not {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    elif isinstance(value, str):
        from dask.utils import parse_bytes as dask_parse_bytes

        try:
            n = int(dask_parse_bytes(value))
        except (ValueError, TypeError):
            raise ValueError(
                f"{what} {value!r} is not a size; write it like '2 GiB', '512 MB' or a number of bytes"
            ) from None
    else:
        raise ValueError(f"{what} must be a number of bytes or a string like '2 GiB', not {type(value).__name__}")
    if n <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return n


def format_bytes(n: float) -> str:
    """Bytes for people: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    from dask.utils import format_bytes as dask_format_bytes

    return dask_format_bytes(int(n))


def step_of(key: str) -> str:
    """The step name a task key starts with (keys are ``"<step>-<token>"``).

    >>> step_of("standardize-3f2a9c")
    'standardize'
    """
    from ..keys import step_name  # graph.keys owns the key format

    return step_name(key)


def _as_key(name: Any) -> Any:
    """A recompute copy's (or a second pass's copy's) key: it is its key's value again, the same size."""
    from ..keys import original_key  # graph.keys owns the key format

    return original_key(name)


def _layer(key: Any) -> Any:
    """A partition key's layer (``("getitem-3f2a", 0, 1)`` -> ``"getitem-3f2a"``), else ``None``:
    partitions of one layer have like sizes, where one step name covers layers of any size
    (every ``getitem`` of an array is a ``getitem``).

    >>> _layer(("getitem-3f2a", 0, 1)), _layer("fit-1")
    ('getitem-3f2a', None)
    """
    return key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else None


class SizeEstimates:
    """Estimated bytes per task key; refined as real sizes are measured."""

    def __init__(
        self,
        hints: Mapping[str, int] | None = None,
        measured: Mapping[str, int] | None = None,
        default: int = 1 << 20,
    ):
        self.hints = dict(hints or {})
        self.measured: dict[str, int] = {}
        self.by_step: dict[str, list[int]] = {}
        self.by_layer: dict[Any, int] = {}  # a collection's layer (a partition key's name): its largest
        self.default = int(default)
        self.update(measured or {})

    def update(self, measured: Mapping[str, int]) -> None:
        """Record real sizes (e.g. the scheduler's ``nbytes`` of finished keys)."""
        for key, n in measured.items():
            if n is None:
                continue
            self.measured[key] = int(n)
            self.by_step.setdefault(step_of(key), []).append(int(n))
            layer = _layer(key)
            if layer is not None:
                self.by_layer[layer] = max(self.by_layer.get(layer, 0), int(n))

    def source(self, key: str) -> str:
        key = _as_key(key)
        if key in self.measured:
            return "measured"
        if key in self.hints:
            return "hint"
        if _layer(key) in self.by_layer:
            return "sibling"
        if step_of(key) in self.by_step:
            return "sibling"
        return "default"

    def get(self, key: str) -> int:
        key = _as_key(key)
        if key in self.measured:
            return self.measured[key]
        if key in self.hints:
            return self.hints[key]
        layer = _layer(key)
        if layer in self.by_layer:  # another partition of the same layer: the closest sibling
            return self.by_layer[layer]
        sizes = self.by_step.get(step_of(key))
        if sizes:
            return max(sizes)
        return self.default

    def __repr__(self) -> str:
        return f"<SizeEstimates {len(self.measured)} measured, {len(self.hints)} hinted, default {self.default}>"
