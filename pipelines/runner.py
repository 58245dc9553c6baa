"""``Node.run``: connect to (or start) a cluster, execute the compiled graph, wrap the result."""

from __future__ import annotations

from typing import Any

from .result import Result

__all__ = ["run_node", "run_search_node", "run_options"]

#: the options ``Node.run`` adds to a run's (``graph.run.options.RunOptions``, their one owner), with
#: their defaults: ``tracking`` (log the run to MLflow, :mod:`pipelines.tracking`)
_OWN = {"tracking": None}


def run_options() -> dict[str, Any]:
    """The options a run takes, with their defaults: ``graph.execute``'s (``graph.run.options.RunOptions``,
    their one owner) and ``tracking``. ``Node.run`` and this module read them here.

    >>> list(run_options())[:3]
    ['workers', 'threads_per_worker', 'memory_limit']
    """
    from graph.run.options import run_options as graph_run_options

    return {**graph_run_options(), **_OWN}


def run_node(node: Any, client: Any = None, **options: Any) -> Result:
    """Run ``node``'s exploration: refuse bad options and definitions before a cluster starts,
    then run it (``graph.execute``'s path: the one run path) and wrap the record in a :class:`Result`.
    ``options``: :func:`run_options` (``tracking``: log it to MLflow, :mod:`pipelines.tracking`)."""
    from graph.spec import SearchSpec

    if isinstance(getattr(node, "spec", None), SearchSpec):  # an adaptive search (issue 47)
        return run_search_node(node, client, **options)
    from graph.run.options import check_options, refuse_unknown

    refuse_unknown(options, run_options(), "Node.run()")  # a clear message rather than a TypeError deep in the run
    tracking = options.pop("tracking", None)
    if tracking is not None and tracking is not False:  # an MLflow run per branch, as each finishes
        from .tracking import Tracker

        with Tracker(tracking, node, memory_budget=options.get("memory_budget")) as tracker:  # an error: the runs end FAILED/KILLED
            return tracker.finish(run_node(node, client, **{**options, "on_driver": tracker.watcher(options.get("on_driver"))}))
    import time

    from graph.run.session import run_checked

    # checked once, before the compile (graph.run.options, their one owner), and passed down to the
    # run (graph.run.session.run_checked): a bad one never waits for a compile
    opts = check_options(caller="Node.run()", **options)
    clock = time.perf_counter()
    compiled = _prepare(node, client, opts.memory_budget, opts.workers)
    record = run_checked(compiled, client, opts, compile_seconds=time.perf_counter() - clock)
    if not opts.quiet:  # a short run that was mostly start-up says so (graph/report/breakdown.py)
        import sys

        from graph.report.breakdown import startup_note

        note = startup_note(record.stats)
        if note:
            print(note, file=sys.stderr, flush=True)
    result = Result(
        table=record.table,
        value=(record.values[0] if record.values else None) if record.single else record.values,
        values=record.values,
        stats=record.stats,
        compiled=compiled,
        memory_plan=record.memory_plan,
        client=record.client,
        _close=record.close,
    )
    _refuse_values_that_cannot_travel(result)
    return result


def _refuse_values_that_cannot_travel(result: Result) -> None:
    """A branch whose value could not be pickled (``graph.parcels.ValueCannotTravel``) ends the
    run with a :class:`graph.RunError` naming the branch, the step and the type (issue 44): the
    choice was made without that branch, which the user must know. Nothing is lost: the error
    carries the whole result (``exc.result``: table, values, stats) and ``exc.table``."""
    table = result.table
    if table is None or "error_kind" not in getattr(table, "columns", ()):
        return
    bad = table[table["error_kind"] == "serialisation"]
    if bad.empty:
        return
    import graph

    first = bad.iloc[0]
    label = first.get("label") if "label" in bad.columns else None
    error = str(first.get("error") or "").strip().splitlines()[-1] if first.get("error") else "a value that cannot be pickled"
    more = f" (and {len(bad) - 1} more branch(es))" if len(bad) > 1 else ""
    exc = graph.RunError(
        f"branch {bad.index[0]}{f' ({label})' if label else ''}: {error}{more}. The choice was made without it; "
        f"return values that pickle (or keep the object inside the step). Every branch's result is in the "
        f"error's .result (its .table has every branch)", table=table)
    exc.result = result  # type: ignore[attr-defined]
    exc.compiled = result.compiled  # type: ignore[attr-defined]  # the CLI's --json/--report read its branches
    raise exc


def _prepare(node: Any, client: Any, memory_budget: Any, workers: int | None) -> Any:
    """The compiled exploration, after the checks that need it: definition errors, unpicklable
    steps and a step hinted too big for the budget fail before a cluster starts."""
    import graph

    compiled = graph.compile(node)
    from .preflight import check_run

    check_run(compiled, client)
    if memory_budget is not None and client is None:  # a step hinted too big for the budget
        from graph.memory.plan import plan_memory
        from gpu.clusters import default_workers

        plan_memory(compiled, memory_budget, workers=workers or default_workers())
    return compiled


def run_search_node(node: Any, client: Any = None, **options: Any):
    """Run a ``node.search(...)`` node (``graph.run.adaptive.run_search``) and wrap its record in a
    :class:`pipelines.SearchResult`."""
    import graph
    from graph.run.adaptive import run_search
    from graph.run.options import check_search_options

    from .preflight import check_run_options

    # a search's options: named and checked by the run options' owner, as a run's, before a cluster starts
    opts = check_search_options(caller="Node.run()", also=_OWN, **options)
    check_run_options(client)  # a scheduler address, as a run's
    try:
        record = run_search(node.spec, client, opts)
    except graph.RunError as exc:
        record = getattr(exc, "record", None)
        if record is not None:
            exc.result = _search_result(record)  # type: ignore[attr-defined]
            exc.table = exc.result.table  # type: ignore[attr-defined]
        raise
    return _search_result(record)


def _search_result(record: Any):
    import pandas as pd

    from .searchresult import SearchResult

    table = pd.DataFrame(record.rows)
    params = None
    if record.best is not None:
        found = [t for t in record.study.get_trials(deepcopy=False) if t.number == record.best]
        params = dict(found[0].params) if found else None
    return SearchResult(table=table, value=record.value, study=record.study, best_trial=record.best,
                        best_params=params, stats=record.stats)
