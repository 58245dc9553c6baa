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
) -> Result:
    import graph
    from graph.cluster import connect
    from graph.executor import execute
    from graph.tracebacks import restore_table

    from graph.watchdog import stall_seconds

    try:  # one meaning (graph.watchdog.stall_seconds), refused before a cluster starts
        stall_seconds(stall_timeout)
    except ValueError as exc:
        raise graph.PipelineError(str(exc)) from None
    if order not in ("depth-first", "dask"):
        raise graph.PipelineError(f"order must be 'depth-first' (Quiver's) or 'dask' (Dask's own), not {order!r}")
    if on_metric_error not in ("stop", "continue"):
        raise graph.PipelineError(
            f"on_metric_error must be 'stop' (end the run when the first branches cannot give their "
            f"metric for the same reason) or 'continue' (run every branch anyway), not {on_metric_error!r}"
        )
    if not isinstance(pack, bool):
        raise graph.PipelineError(f"pack must be True (train packable gpu.train branches together) or False, not {pack!r}")
    import time

    clock = time.perf_counter()
    compiled = graph.compile(node)  # compile first: definition errors surface before a cluster starts
    if store is not None:  # a bad store path is refused before a cluster starts
        from graph.store import ResultStore

        try:
            store = ResultStore(store)
        except (ValueError, OSError) as exc:
            raise graph.PipelineError(f"store: {exc}") from None
    from .preflight import check_run  # bad options or unpicklable steps: refused before a cluster starts

    check_run(compiled, client, workers=workers, threads_per_worker=threads_per_worker)
    if memory_budget is not None:  # a bad budget, or a step hinted too big, fails before a cluster starts
        from graph.memory.plan import plan_memory
        from graph.memory.sizes import parse_bytes

        try:
            parse_bytes(memory_budget)
            if disk_bandwidth is not None:
                parse_bytes(disk_bandwidth, "disk_bandwidth")
        except ValueError as exc:
            raise graph.PipelineError(str(exc)) from None
        if client is None:
            from graph.cluster import default_workers

            plan_memory(compiled, memory_budget, workers=workers or default_workers())
    import contextlib

    compile_seconds = time.perf_counter() - clock
    cluster_info: dict = {}
    with contextlib.ExitStack() as stack:
        clock = time.perf_counter()
        c = stack.enter_context(connect(
            client,
            memory_budget=memory_budget if client is None else None,
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            memory_limit=memory_limit,
            quiet=quiet,
            info=cluster_info,
        ))
        cluster_seconds = time.perf_counter() - clock
        from graph.breakdown import Collector
        from graph.warmup import step_modules, warm_workers

        timing = Collector(c)  # graph/breakdown.py: where the time went, from Dask's task stream
        timing.begin()
        warm_workers(c, step_modules(compiled))  # every worker imports the steps' modules now, all at once
        timing.imported()
        if pack:  # gpu.train branches that can share a worker train as one group (docs/architecture.md §7.3)
            from graph.packing import pack_compiled

            threads = c.nthreads()  # one packed task per worker thread, each placed on its own
            pack_compiled(compiled, workers=[w for w in sorted(threads) for _ in range(threads[w])])
        try:
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
            )
        except graph.RunError as exc:
            exc.compiled = compiled  # the CLI's --json/--report of a failed run read its branches
            restore_table(exc.table, compiled)
            raise
        finally:
            takeovers = None
            if compiled.claim_tables:  # graph.claims: the packed tasks' tables, done with
                from graph.claims import forget_claims, takeovers_on_scheduler

                with contextlib.suppress(Exception):
                    takeovers = c.run_on_scheduler(takeovers_on_scheduler, names=compiled.claim_tables)
                with contextlib.suppress(Exception):
                    c.run_on_scheduler(forget_claims, names=compiled.claim_tables)
        record.stats["time_breakdown"] = timing.finish(compiled)
        # persisted Dask collections live on the cluster: an embedded one stays open for them
        # until Result.close() (docs/architecture.md §8); compute_value=True gathers them instead
        distributed = any(b.parts for b in compiled.branches) and not compute_value
        close = stack.pop_all().close if distributed else None
    # where the time outside the run went: compile (and pre-flight checks), and the cluster
    # ("started": an embedded one, "reused": kept from the process's last run, "given"/"connected")
    record.stats["compile_seconds"] = compile_seconds
    record.stats["cluster"] = cluster_info.get("cluster")
    record.stats["cluster_seconds"] = cluster_seconds
    packed = compiled.packed
    if packed:  # graph.packing: packed tasks (one stacked group each) and the branches they trained
        record.stats["packed_groups"] = len(packed)
        record.stats["packed_branches"] = len({k for m in packed.values() for k in m})
        if takeovers is not None:  # members an idle packed task took over from a busier one
            record.stats["packed_takeovers"] = takeovers
    restore_table(record.table, compiled)  # the user's file names in tracebacks, not "<dynamic-code>"
    if record.single:
        value = record.values[0] if record.values else None
    else:
        value = record.values
    return Result(
        table=record.table,
        value=value,
        values=record.values,
        stats=record.stats,
        compiled=compiled,
        memory_plan=record.memory_plan,
        client=c if distributed else None,
        _close=close,
    )
