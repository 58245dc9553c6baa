"""``Node.run``: connect to (or start) a cluster, execute the compiled graph, wrap the result."""

from __future__ import annotations

from typing import Any

from .result import Result

__all__ = ["run_node"]


def run_node(
    node: Any,
    client: Any = None,
    *,
    workers: int | None = None,
    threads_per_worker: int = 1,
    memory_limit: str | int | None = "auto",
    progress: bool | None = None,
    quiet: bool = False,
    raise_if_all_failed: bool = True,
    store: Any = None,
    memory_budget: Any = None,
    sample_sizes: bool = False,
    order: str = "depth-first",
    disk_bandwidth: Any = None,
    on_metric_error: str = "stop",
    stall_timeout: float | None = None,
    pack: bool = True,
    compute_value: bool = False,
    tracking: Any = None,
    on_driver: Any = None,
) -> Result:
    """Run ``node``'s exploration: refuse bad options and definitions before a cluster starts,
    then connect, prepare the cluster, execute, and wrap the record in a :class:`Result`.
    ``tracking``: log it to MLflow (:mod:`pipelines.tracking`); ``on_driver``: as
    ``graph.run.executor.execute``'s."""
    if tracking is not None and tracking is not False:  # an MLflow run per branch, as each finishes
        options = {k: v for k, v in locals().items() if k not in ("node", "client", "tracking", "on_driver")}
        from .tracking import Tracker

        with Tracker(tracking, node, memory_budget=memory_budget) as tracker:  # an error: the runs end FAILED/KILLED
            return tracker.finish(run_node(node, client, **options, on_driver=tracker.watcher(on_driver)))
    import time

    import graph

    from graph.run.options import check_options

    # the options are checked before the compile (graph.run.options, their one owner); the run checks
    # them again where it takes them (graph.run.session): a bad one never waits for a compile
    check_options(order=order, on_metric_error=on_metric_error, stall_timeout=stall_timeout, pack=pack,
                  memory_budget=memory_budget, disk_bandwidth=disk_bandwidth, sample_sizes=sample_sizes)
    clock = time.perf_counter()
    compiled = _prepare(node, client, memory_budget, workers, threads_per_worker)
    record = graph.execute(
        compiled, client, workers=workers, threads_per_worker=threads_per_worker, memory_limit=memory_limit,
        progress=progress, quiet=quiet, raise_if_all_failed=raise_if_all_failed, store=store,
        memory_budget=memory_budget, sample_sizes=sample_sizes, order=order, disk_bandwidth=disk_bandwidth,
        on_metric_error=on_metric_error, stall_timeout=stall_timeout, pack=pack, compute_value=compute_value,
        on_driver=on_driver, compile_seconds=time.perf_counter() - clock,
    )
    if not quiet:  # a short run that was mostly start-up says so (graph/report/breakdown.py)
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


def _prepare(node: Any, client: Any, memory_budget: Any, workers: int | None, threads_per_worker: int) -> Any:
    """The compiled exploration, after the checks that need it: definition errors, unpicklable
    steps and a step hinted too big for the budget fail before a cluster starts."""
    import graph

    compiled = graph.compile(node)
    from .preflight import check_run

    check_run(compiled, client, workers=workers, threads_per_worker=threads_per_worker)
    if memory_budget is not None and client is None:  # a step hinted too big for the budget
        from graph.memory.plan import plan_memory
        from gpu.clusters import default_workers

        plan_memory(compiled, memory_budget, workers=workers or default_workers())
    return compiled
