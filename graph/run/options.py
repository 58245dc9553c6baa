"""A run's options, written once: each one's name, default and check, and whether a search takes it.

:class:`RunOptions` is their one owner (issue 45: one owner per rule). ``graph.execute``
(``graph.run.session.run_compiled``), ``Node.run`` (pipelines/runner.py), the CLI
(pipelines/cli.py), the driver (``graph.run.executor.execute``) and an adaptive search
(``graph.run.adaptive.run_search``) take their names and defaults from it; a run checks them
once (:func:`check_options`, before a cluster starts) and passes the checked :class:`RunOptions`
down. A bad option is refused with a message naming it and how to fix it.

The scheduler address a run is given (not an option) is ``pipelines.preflight``'s to check.

>>> opts = check_options(order="dask", stall_timeout=0, memory_budget="1 KiB")
>>> (opts.order, opts.stall_seconds, opts.memory_budget)
('dask', None, '1 KiB')
>>> check_options(order="random")
Traceback (most recent call last):
...
graph.errors.PipelineError: order must be 'depth-first' (Quiver's) or 'dask' (Dask's own), not 'random'
>>> check_options(wokers=2)
Traceback (most recent call last):
...
TypeError: the run: unknown option(s) 'wokers'; options: workers, threads_per_worker, memory_limit, progress, quiet, raise_if_all_failed, store, memory_budget, sample_sizes, order, disk_bandwidth, on_metric_error, stall_timeout, pack, compute_value, on_driver

The CLI names its flags instead of the keyword arguments:

>>> check_options(sample_sizes=True, spelled={"sample_sizes": "--sample-sizes", "memory_budget": "--memory-budget"})
Traceback (most recent call last):
...
graph.errors.PipelineError: --sample-sizes plans memory with measured sizes, so it needs --memory-budget too (e.g. 2GiB)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

from ..errors import PipelineError

__all__ = ["ORDERS", "RunOptions", "check_options", "check_search_options", "refuse_unknown", "run_options",
           "search_options", "takes_run_options"]

#: ``order``: Quiver's depth-first priorities, or Dask's own ordering (for comparison)
ORDERS = ("depth-first", "dask")


def _search(default: Any) -> Any:
    """An option an adaptive search takes too (``graph.run.adaptive.run_search``)."""
    return field(default=default, metadata={"search": True})


@dataclass(frozen=True)
class RunOptions:
    """A run's options, checked when made (``PipelineError`` naming a bad one; ``spelled``: how the
    caller names each option in messages, e.g. the CLI's flags). ``store`` comes back as a
    ``graph.tasks.store.ResultStore`` (its directory made) or ``None``; ``stall_seconds`` is
    ``stall_timeout``'s meaning (``graph.state.watchdog.stall_seconds``: ``None`` when the watchdog
    is off). What each option does: ``Node.run``'s docstring (pipelines/builder.py) and
    ``graph.run.executor.execute``'s."""

    # where the run happens (an embedded cluster's shape)
    workers: int | None = _search(None)
    threads_per_worker: int = _search(1)
    memory_limit: str | int | None = _search("auto")
    # what the run shows, and how it ends
    progress: bool | None = _search(None)
    quiet: bool = _search(False)
    raise_if_all_failed: bool = _search(True)
    # how it runs
    store: Any = None
    memory_budget: Any = None
    sample_sizes: bool = False
    order: str = "depth-first"
    disk_bandwidth: Any = None
    on_metric_error: str = "stop"
    stall_timeout: float | None = _search(None)
    pack: bool = True
    compute_value: bool = False
    on_driver: Callable | None = None
    spelled: InitVar[Mapping[str, str] | None] = None
    stall_seconds: float | None = field(init=False, repr=False, compare=False)

    def __post_init__(self, spelled: Mapping[str, str] | None) -> None:
        stall, store = _check(self, spelled)
        object.__setattr__(self, "stall_seconds", stall)
        object.__setattr__(self, "store", store)


def run_options() -> dict[str, Any]:
    """Every run option, by name, with its default (:class:`RunOptions`' fields, in order).

    >>> opts = run_options()
    >>> opts["order"], opts["pack"], "stall_seconds" in opts
    ('depth-first', True, False)
    """
    return {f.name: f.default for f in fields(RunOptions) if f.init}


def search_options() -> dict[str, Any]:
    """The run options an adaptive search takes, with their defaults (the others it refuses when set).

    >>> list(search_options())
    ['workers', 'threads_per_worker', 'memory_limit', 'progress', 'quiet', 'raise_if_all_failed', 'stall_timeout']
    """
    return {f.name: f.default for f in fields(RunOptions) if f.init and f.metadata.get("search")}


def refuse_unknown(given: Iterable[str], known: Iterable[str], caller: str, listed: Iterable[str] | None = None) -> None:
    """A ``TypeError`` naming the options in ``given`` that are not ``known``, and the ones the
    caller takes (``listed``; default: ``known``): a clear message rather than a ``TypeError``
    deep in the run."""
    known = list(known)
    unknown = [o for o in given if o not in known]
    if unknown:
        raise TypeError(f"{caller}: unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"options: {', '.join(known if listed is None else listed)}")


def check_options(*, spelled: Mapping[str, str] | None = None, caller: str = "the run", **options: Any) -> RunOptions:
    """``options`` (any of :func:`run_options`, by keyword) checked: a ``TypeError`` for a name
    that is no option (``caller`` says who was given it), a ``PipelineError`` naming a bad value."""
    refuse_unknown(options, run_options(), caller)
    return RunOptions(**options, spelled=spelled)


def check_search_options(*, caller: str = "the search", also: Mapping[str, Any] | None = None,
                         **options: Any) -> RunOptions:
    """An adaptive search's ``options`` checked as a run's (:func:`check_options`), after two refusals
    (``TypeError``): a name that is no option (the same message as a run's, listing what a search
    takes), and an option a search does not take (yet), when set: a caller passing every option
    at its default, as a wrapper may, is not refused for it. ``also``: options the caller adds
    (``Node.run``'s ``tracking``), with their defaults; a search takes none of them.

    >>> check_search_options(memory_budget="1 GiB")
    Traceback (most recent call last):
    ...
    TypeError: the search: a search does not take 'memory_budget' yet; its options: workers, threads_per_worker, memory_limit, progress, quiet, raise_if_all_failed, stall_timeout
    """
    known, takes = {**run_options(), **(also or {})}, search_options()
    refuse_unknown(options, known, caller, listed=takes)
    not_yet = [o for o in options if o not in takes and options[o] != known[o]]
    if not_yet:
        raise TypeError(f"{caller}: a search does not take {', '.join(map(repr, not_yet))} yet; "
                        f"its options: {', '.join(takes)}")
    return check_options(caller=caller, **{o: v for o, v in options.items() if o in takes})


def takes_run_options(fn: Callable) -> Callable:
    """``fn``'s ``**options`` shown (``inspect.signature``, ``help``, the API docs) as the run
    options by name, with their defaults: the names a caller may pass, from their owner."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = next((i for i, p in enumerate(params) if p.kind is p.KEYWORD_ONLY), len(params))
    opts = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in fields(RunOptions) if f.init]
    fn.__signature__ = sig.replace(parameters=params[:at] + opts + params[at:])
    return fn


def _check(opts: RunOptions, spelled: Mapping[str, str] | None) -> tuple[float | None, Any]:
    """Every check of a run's options, in one place; returns ``(stall seconds, the store)``."""
    name = (lambda k: spelled.get(k, k)) if spelled else (lambda k: k)  # noqa: E731
    _whole(name("workers"), opts.workers, " (or None for one per core)", optional=True)
    _whole(name("threads_per_worker"), opts.threads_per_worker)
    if opts.order not in ORDERS:
        raise PipelineError(f"{name('order')} must be 'depth-first' (Quiver's) or 'dask' (Dask's own), not {opts.order!r}")
    from ..state.machine import METRIC_ERROR_MODES  # the state machine's rule: its modes

    if opts.on_metric_error not in METRIC_ERROR_MODES:
        raise PipelineError(
            f"{name('on_metric_error')} must be 'stop' (end the run when the first branches cannot give their "
            f"metric for the same reason) or 'continue' (run every branch anyway), not {opts.on_metric_error!r}"
        )
    if not isinstance(opts.pack, bool):
        raise PipelineError(f"{name('pack')} must be True (train packable gpu.train branches together) or False, not {opts.pack!r}")
    if not isinstance(opts.sample_sizes, bool):
        raise PipelineError(f"{name('sample_sizes')} must be True or False, not {opts.sample_sizes!r}")
    from ..state.watchdog import stall_seconds  # the one meaning of stall_timeout

    try:
        stall = stall_seconds(opts.stall_timeout)
    except ValueError as exc:
        raise PipelineError(str(exc).replace("stall_timeout", name("stall_timeout"), 1)) from None
    budget = _bytes(opts.memory_budget, spelled.get("memory_budget", "memory budget") if spelled else "memory budget")
    _bytes(opts.disk_bandwidth, name("disk_bandwidth"))
    if opts.sample_sizes and budget is None:
        raise PipelineError(
            f"{name('sample_sizes')} plans memory with measured sizes, so it needs {name('memory_budget')} too (e.g. 2GiB)"
        )
    store = opts.store
    if store is not None:
        from ..tasks.store import ResultStore

        try:
            store = ResultStore(store)
        except (ValueError, OSError) as exc:
            raise PipelineError(f"{name('store')}: {exc}") from None
    return stall, store


def _whole(what: str, value: Any, hint: str = "", optional: bool = False) -> None:
    """A whole number >= 1 (``None`` too, when ``optional``)."""
    import numbers

    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PipelineError(f"run: {what} must be a whole number >= 1{hint}, got {value!r}")


def _bytes(value: Any, what: str) -> int | None:
    """``None``, or a positive number of bytes (``graph.memory.sizes.parse_bytes``'s rule)."""
    if value is None:
        return None
    from ..memory.sizes import parse_bytes

    try:
        return parse_bytes(value, what)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
