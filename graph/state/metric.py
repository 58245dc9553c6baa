"""Reading a choose's metric off a step's output, and the cause a failed read gives.

Pure: the compiler puts :func:`extract_metric` in the run's metric graph (it runs on a
worker), and the state machine reads an iterative step's reports with it and names a failed
read's cause with :func:`metric_failure_cause` (two branches failing alike, one cause).

>>> extract_metric({"acc": 0.9, "model": object()}, "acc", "choose('acc')")
(0.9, {'acc': 0.9})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..parcels import opened
from ..scalars import scalar_entries
from .halving import Pruned

__all__ = ["extract_metric", "metric_failure_cause"]


def metric_failure_cause(error: str | None) -> str:
    """The reason a metric read failed, without what differs from branch to branch (which
    values, which keys), so that two branches failing alike give the same cause.

    >>> metric_failure_cause("KeyError: choose('acc'): the step's output has no key 'acc' (keys: ['x'])")
    "the step's output has no key 'acc'"
    >>> metric_failure_cause("TypeError: choose('x'): metric 'x' must be a real number, got str 'abc'")
    "the metric 'x' is not a number"
    >>> metric_failure_cause("ZeroDivisionError: division by zero")
    'ZeroDivisionError: division by zero'
    """
    text = error or ""
    if "which must be a mapping" in text:
        return "the step's output is not a mapping"
    found = re.search(r"has no key ('[^']*'|\S+) \(keys:", text)
    if found:
        return f"the step's output has no key {found.group(1)}"
    found = re.search(r"metric ('[^']*'|\S+) must be a real number", text)
    if found:
        return f"the metric {found.group(1)} is not a number"
    return text.splitlines()[0] if text else ""


def extract_metric(value: Any, metric: Any, where: str) -> tuple[float, dict[str, Any]]:
    """Read a choose metric off a step's output (runs on a worker), with the output's
    scalar entries so the table can show every branch's figures without moving its value.

    A step a pruning choose stopped (``graph.state.halving.Pruned``) gives NaN quietly: the run
    cancelled this read when it stopped the step, but the cancel travels on the client's
    batched stream and may reach the scheduler after the step returned; nothing reads it.
    A parcel (``graph.parcels``) is read on this thread."""
    value = opened(value)
    if isinstance(value, Pruned):
        return float("nan"), {}
    if callable(metric):
        raw = metric(value)
    else:
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{where}: the metric {metric!r} is read from the step's output, which must be a "
                f"mapping (e.g. a dict with key {metric!r}); the step returned "
                f"{type(value).__name__}. Return a dict, or pass a callable metric."
            )
        if metric not in value:
            raise KeyError(
                f"{where}: the step's output has no key {metric!r} (keys: {sorted(map(str, value))})"
            )
        raw = value[metric]
    try:
        return float(raw), scalar_entries(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{where}: metric {metric!r} must be a real number, got {type(raw).__name__} {raw!r}"
        ) from None
