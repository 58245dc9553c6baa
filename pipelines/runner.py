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
    import contextlib
    import time

    import graph
    from graph.cluster.connect import connect
    from graph.run.executor import execute
    from graph.run.options import check_options
    from graph.report.tracebacks import restore_table
    from graph.cluster.warmup import step_modules

    # every run option is checked by its one owner (graph.run.options), before anything runs
    store = check_options(order=order, on_metric_error=on_metric_error, stall_timeout=stall_timeout, pack=pack,
                          memory_budget=memory_budget, disk_bandwidth=disk_bandwidth, sample_sizes=sample_sizes,
                          store=store).store
    clock = time.perf_counter()
    compiled = _prepare(node, client, memory_budget, workers, threads_per_worker)
    compile_seconds = time.perf_counter() - clock
    cluster_info: dict = {}
    modules = step_modules(compiled)  # what the steps import: preloaded by new workers, then warmed up
    bridge = client is None and _bridged(compiled, modules)  # connect() leaves budgeted runs out
    from graph.report.logdigest import digested_dask_logs

    # Dask's own warnings in this process: once each, repeats counted (quiver run --verbose: all)
    with digested_dask_logs(), contextlib.ExitStack() as stack:
        clock = time.perf_counter()
        c = stack.enter_context(connect(
            client,
            memory_budget=memory_budget if client is None else None,
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            memory_limit=memory_limit,
            quiet=quiet,
            info=cluster_info,
            preload=modules if client is None else (),
            bridge=bridge,
        ))
        cluster_seconds = time.perf_counter() - clock
        from graph.report.breakdown import Collector

        timing = Collector(c)  # graph/report/breakdown.py: where the time went, from Dask's task stream
        timing.begin()
        _ready_cluster(c, compiled, pack, modules)
        timing.imported()
        from graph.run import sharedcopies, spread
        from graph.dashboard.plugin import run_memory
        from graph.report.stepwarnings import replay, watch

        with watch(c) as seen:  # warnings from steps: shown once, here, after the run
            takeovers = None
            copies = placing = None
            try:
                # what several training steps read is copied to every worker as soon as it exists
                copies = sharedcopies.install(c, compiled, budgeted=memory_budget is not None)
                # a task made ready while its inputs' workers are busy starts on an idle worker
                placing = spread.install(c, compiled, budgeted=memory_budget is not None)
                record = execute(
                    compiled,
                    c,
                    progress=progress,
                    raise_if_all_failed=raise_if_all_failed,
                    store=store,
                    memory_budget=memory_budget,
                    sample_sizes=sample_sizes,
                    order=order,
                    disk_bandwidth=disk_bandwidth,
                    stall_timeout=stall_timeout,
                    on_metric_error=on_metric_error,
                    compute_value=compute_value,
                    on_driver=on_driver,
                )
            except graph.RunError as exc:
                exc.compiled = compiled  # the CLI's --json/--report of a failed run read its branches
                restore_table(exc.table, compiled)
                raise
            finally:
                step_warnings = replay(seen, compiled)
                takeovers = _forget_claims(c, compiled)
                copied = sharedcopies.remove(c, copies)  # on every path: the plugin lives for one run
                spread_tasks = spread.remove(c, placing)
        record.stats["time_breakdown"] = timing.finish(compiled)
        record.stats["worker_memory"] = run_memory(c, record.run_id)  # per worker over time (graph.memory.timeline)
        if memory_budget is not None:  # the cluster's total over time, from the same samples (one sampler)
            from graph.memory.timeline import totals

            record.stats["memory_timeline"] = totals((record.stats["worker_memory"] or {}).get("timeline"))
        # copies of shared inputs asked for ahead of their readers: {key: [worker, ...]}
        record.stats["shared_copies"] = copied
        record.stats["spread_tasks"] = spread_tasks  # ready tasks sent to idle workers (graph/run/spread.py)
        # persisted Dask collections live on the cluster: an embedded one stays open for them
        # until Result.close() (docs/architecture.md §8); compute_value=True gathers them instead
        distributed = any(b.parts for b in compiled.branches) and not compute_value
        close = stack.pop_all().close if distributed else None
    # where the time outside the run went: compile (and pre-flight checks), and the cluster
    # ("started": an embedded one, "reused": kept from the process's last run, "given"/"connected")
    record.stats["compile_seconds"] = compile_seconds
    record.stats["cluster"] = cluster_info.get("cluster")
    record.stats["worker_start"] = cluster_info.get("start_method")  # "forkserver" or "spawn"; None when not started here
    record.stats["cluster_seconds"] = cluster_seconds
    record.stats["bridge"] = bool(cluster_info.get("bridge"))  # began in this process (graph/cluster/bridge.py)
    _packing_stats(record.stats, compiled, takeovers)
    record.stats["step_warnings"] = step_warnings  # distinct warnings the steps raised (shown once each)
    restore_table(record.table, compiled)  # the user's file names in tracebacks, not "<dynamic-code>"
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
        client=c if distributed else None,
        _close=close,
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


def _bridged(compiled: Any, modules: list[str]) -> bool:
    """A run of plain steps may start on this process while a new cluster's workers start
    (graph/cluster/bridge.py)."""
    from graph.cluster.bridge import eligible

    return eligible(compiled.graph, collections=compiled.has_collections, modules=modules)


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


def _ready_cluster(c: Any, compiled: Any, pack: bool, modules: list[str]) -> None:
    """Every worker imports the steps' ``modules`` now, all at once (forked workers have them
    already); then ``gpu.train`` branches that
    can share a worker are packed into groups (docs/architecture.md §7.3), one packed task per
    worker thread, each placed on its own."""
    from graph.bounded import answered
    from graph.cluster.warmup import warm_workers

    warm_workers(c, modules)
    if pack:
        from graph.compiling.packing import pack_compiled

        threads = answered(c.nthreads, what="counting the workers' threads")
        pack_compiled(compiled, workers=[w for w in sorted(threads) for _ in range(threads[w])])


def _forget_claims(c: Any, compiled: Any) -> int | None:
    """Drop the packed tasks' claim tables (``graph.compiling.packing``) from the scheduler, done with;
    returns how many members were taken over (``None``: no tables, or the scheduler did not say)."""
    if not compiled.claim_tables:
        return None
    import contextlib

    import time

    from graph.bounded import CLEANUP_SECONDS, within
    from graph.compiling.packing import forget_claims, takeovers_on_scheduler

    takeovers = None
    deadline = time.monotonic() + CLEANUP_SECONDS  # a clean-up: bounded, and given up quietly
    with contextlib.suppress(Exception):
        takeovers = within(deadline, c.run_on_scheduler, takeovers_on_scheduler, names=compiled.claim_tables,
                           what="counting the packed tasks' takeovers")
    with contextlib.suppress(Exception):
        within(deadline, c.run_on_scheduler, forget_claims, names=compiled.claim_tables, what="forgetting the claim tables")
    return takeovers


def _packing_stats(stats: dict, compiled: Any, takeovers: int | None) -> None:
    """Packed tasks (one stacked group each), the branches they trained, and members an idle
    packed task took over from a busier one (``graph.compiling.packing``)."""
    packed = compiled.packed
    if packed:
        stats["packed_groups"] = len(packed)
        stats["packed_branches"] = len({k for m in packed.values() for k in m})
        if takeovers is not None:
            stats["packed_takeovers"] = takeovers
