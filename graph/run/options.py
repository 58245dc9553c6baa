"""A run's options, checked in one place: ``Node.run`` (pipelines/runner.py), ``graph.run.executor.execute``
and the CLI (pipelines/cli.py) all call :func:`check_options`, which refuses a bad option with a
message naming it and how to fix it, and returns the options in the form the run uses.

Where a run happens (``workers``, ``threads_per_worker``, a scheduler address) is
``pipelines.preflight``'s; how it runs is this module's.

>>> opts = check_options(order="dask", stall_timeout=0, memory_budget="1 KiB")
>>> (opts.order, opts.stall_seconds, opts.memory_budget_bytes)
('dask', None, 1024)
>>> check_options(order="random")
Traceback (most recent call last):
...
graph.errors.PipelineError: order must be 'depth-first' (Quiver's) or 'dask' (Dask's own), not 'random'

The CLI names its flags instead of the keyword arguments:

>>> check_options(sample_sizes=True, spelled={"sample_sizes": "--sample-sizes", "memory_budget": "--memory-budget"})
Traceback (most recent call last):
...
graph.errors.PipelineError: --sample-sizes plans memory with measured sizes, so it needs --memory-budget too (e.g. 2GiB)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PipelineError

__all__ = ["ORDERS", "RunOptions", "check_options"]

#: ``order``: Quiver's depth-first priorities, or Dask's own ordering (for comparison)
ORDERS = ("depth-first", "dask")


@dataclass(frozen=True)
class RunOptions:
    """Checked run options: ``stall_seconds`` is ``None`` when the watchdog is off
    (``graph.state.watchdog.stall_seconds``); the byte counts are ``None`` when not given; ``store``
    is a ``graph.tasks.store.ResultStore`` (its directory made) or ``None``."""

    order: str = "depth-first"
    on_metric_error: str = "stop"
    stall_seconds: float | None = None
    pack: bool = True
    memory_budget_bytes: int | None = None
    disk_bandwidth_bytes: int | None = None
    sample_sizes: bool = False
    store: Any = None


def check_options(
    *,
    order: str = "depth-first",
    on_metric_error: str = "stop",
    stall_timeout: float | None = None,
    pack: bool = True,
    memory_budget: Any = None,
    disk_bandwidth: Any = None,
    sample_sizes: bool = False,
    store: Any = None,
    spelled: Mapping[str, str] | None = None,
) -> RunOptions:
    """Check a run's options (before a cluster starts); raise ``PipelineError`` naming the bad one.

    ``spelled``: how the caller names each option in messages (the CLI's flags), by keyword."""
    name = (lambda k: spelled.get(k, k)) if spelled else (lambda k: k)  # noqa: E731
    if order not in ORDERS:
        raise PipelineError(f"{name('order')} must be 'depth-first' (Quiver's) or 'dask' (Dask's own), not {order!r}")
    from ..state.machine import METRIC_ERROR_MODES  # the state machine's rule: its modes

    if on_metric_error not in METRIC_ERROR_MODES:
        raise PipelineError(
            f"{name('on_metric_error')} must be 'stop' (end the run when the first branches cannot give their "
            f"metric for the same reason) or 'continue' (run every branch anyway), not {on_metric_error!r}"
        )
    if not isinstance(pack, bool):
        raise PipelineError(f"{name('pack')} must be True (train packable gpu.train branches together) or False, not {pack!r}")
    if not isinstance(sample_sizes, bool):
        raise PipelineError(f"{name('sample_sizes')} must be True or False, not {sample_sizes!r}")
    from ..state.watchdog import stall_seconds  # the one meaning of stall_timeout

    try:
        stall = stall_seconds(stall_timeout)
    except ValueError as exc:
        raise PipelineError(str(exc).replace("stall_timeout", name("stall_timeout"), 1)) from None
    budget = _bytes(memory_budget, spelled.get("memory_budget", "memory budget") if spelled else "memory budget")
    bandwidth = _bytes(disk_bandwidth, name("disk_bandwidth"))
    if sample_sizes and budget is None:
        raise PipelineError(
            f"{name('sample_sizes')} plans memory with measured sizes, so it needs {name('memory_budget')} too (e.g. 2GiB)"
        )
    if store is not None:
        from ..tasks.store import ResultStore

        try:
            store = ResultStore(store)
        except (ValueError, OSError) as exc:
            raise PipelineError(f"{name('store')}: {exc}") from None
    return RunOptions(order, on_metric_error, stall, pack, budget, bandwidth, sample_sizes, store)


def _bytes(value: Any, what: str) -> int | None:
    """``None``, or a positive number of bytes (``graph.memory.sizes.parse_bytes``'s rule)."""
    if value is None:
        return None
    from ..memory.sizes import parse_bytes

    try:
        return parse_bytes(value, what)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
