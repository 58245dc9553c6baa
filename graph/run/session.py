"""The one run path: a compiled exploration run on a cluster, with everything a run gets.

``run_compiled`` (``graph.execute``) connects to (or starts) the cluster, warms its workers up,
packs training branches, installs the run's plugins (shared copies, the spread, step warnings,
Dask's warnings digested), drives the state machine (:func:`graph.run.executor.execute`), and
assembles the run's stats in one place; ``Node.run``, ``quiver run`` and the scikit-learn
drop-ins reach it through ``pipelines.runner.run_node``, and a compiled pipeline gets the same
through ``graph.execute`` (issue 45: one run path).

>>> import graph
>>> from pipelines import Pipeline, grid
>>> def load(): return 2
>>> def power(x, p): return {"v": x ** p}
>>> compiled = graph.compile(Pipeline("s").source(load).explore("p", grid(power, p=[1, 2])).choose("v"))
>>> record = graph.execute(compiled, workers=1, quiet=True, progress=False)   # doctest: +SKIP
>>> record.values[0]["v"], sorted(record.stats)[:2]                            # doctest: +SKIP
(4, ['bridge', 'busy_fraction'])
"""

from __future__ import annotations

from typing import Any

from .executor import RunRecord
from .options import RunOptions, check_options, run_options, takes_run_options

__all__ = ["run_compiled", "run_checked", "run_options"]


@takes_run_options
def run_compiled(compiled: Any, client: Any = None, *, compile_seconds: float = 0.0, **options: Any) -> RunRecord:
    """Run ``compiled`` on ``client`` (a ``Client``, a scheduler address, or ``None``: an embedded
    ``LocalCluster`` of ``workers``) and return its :class:`RunRecord`, stats assembled; when the
    values are persisted Dask collections, ``record.client`` is the cluster they live on and
    ``record.close`` closes an embedded one (else both ``None``). ``options``: the run options
    (``graph.run.options.RunOptions``, their one owner; :func:`run_options` lists them), checked
    here before anything runs. ``compile_seconds``: the caller's compile and pre-flight time,
    reported in the stats."""
    return run_checked(compiled, client, check_options(caller="graph.execute()", **options), compile_seconds)


def run_checked(compiled: Any, client: Any, opts: RunOptions, compile_seconds: float = 0.0) -> RunRecord:
    """:func:`run_compiled` with its options checked already (``Node.run`` checks them before it
    compiles, once, and passes them down)."""
    import contextlib
    import time

    from ..cluster.connect import connect
    from ..cluster.warmup import step_modules
    from ..errors import RunError
    from ..report.tracebacks import restore_table
    from .executor import execute

    cluster_info: dict = {}
    modules = step_modules(compiled)  # what the steps import: preloaded by new workers, then warmed up
    bridge = client is None and _bridged(compiled, modules)  # connect() leaves budgeted runs out
    from ..report.logdigest import digested_dask_logs

    # Dask's own warnings in this process: once each, repeats counted (quiver run --verbose: all)
    with digested_dask_logs(), contextlib.ExitStack() as stack:
        clock = time.perf_counter()
        c = stack.enter_context(connect(
            client,
            memory_budget=opts.memory_budget if client is None else None,
            n_workers=opts.workers,
            threads_per_worker=opts.threads_per_worker,
            memory_limit=opts.memory_limit,
            quiet=opts.quiet,
            info=cluster_info,
            preload=modules if client is None else (),
            bridge=bridge,
        ))
        cluster_seconds = time.perf_counter() - clock
        from ..report.breakdown import Collector

        timing = Collector(c)  # graph/report/breakdown.py: where the time went, from Dask's task stream
        timing.begin()
        _ready_cluster(c, compiled, opts.pack, modules)
        timing.imported()
        from ..dashboard.plugin import run_memory
        from ..report.stepwarnings import replay, watch
        from . import sharedcopies, spread

        with watch(c) as seen:  # warnings from steps: shown once, here, after the run
            takeovers = None
            copies = placing = None
            try:
                # what several training steps read is copied to every worker as soon as it exists
                copies = sharedcopies.install(c, compiled, budgeted=opts.memory_budget is not None)
                # a task made ready while its inputs' workers are busy starts on an idle worker
                placing = spread.install(c, compiled, budgeted=opts.memory_budget is not None)
                record = execute(compiled, c, opts)  # the options checked once, passed down
            except RunError as exc:
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
        if opts.memory_budget is not None:  # the cluster's total over time, from the same samples (one sampler)
            from ..memory.timeline import totals

            record.stats["memory_timeline"] = totals((record.stats["worker_memory"] or {}).get("timeline"))
        # copies of shared inputs asked for ahead of their readers: {key: [worker, ...]}
        record.stats["shared_copies"] = copied
        record.stats["spread_tasks"] = spread_tasks  # ready tasks sent to idle workers (graph/run/spread.py)
        # persisted Dask collections live on the cluster: an embedded one stays open for them
        # until Result.close() (docs/architecture.md §8); compute_value=True gathers them instead
        distributed = any(b.parts for b in compiled.branches) and not opts.compute_value
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
    record.client = c if distributed else None
    record.close = close
    return record


def _bridged(compiled: Any, modules: list[str]) -> bool:
    """A run of plain steps may start on this process while a new cluster's workers start
    (graph/cluster/bridge.py)."""
    from ..cluster.bridge import eligible

    return eligible(compiled.graph, collections=compiled.has_collections, modules=modules)


def _ready_cluster(c: Any, compiled: Any, pack: bool, modules: list[str]) -> None:
    """Every worker imports the steps' ``modules`` now, all at once (forked workers have them
    already); then ``gpu.train`` branches that
    can share a worker are packed into groups (docs/architecture.md §7.3), one packed task per
    worker thread, each placed on its own."""
    from ..bounded import answered
    from ..cluster.warmup import warm_workers

    warm_workers(c, modules)
    if pack:
        from ..compiling.packing import pack_compiled

        threads = answered(c.nthreads, what="counting the workers' threads")
        pack_compiled(compiled, workers=[w for w in sorted(threads) for _ in range(threads[w])])


def _forget_claims(c: Any, compiled: Any) -> int | None:
    """Drop the packed tasks' claim tables (``graph.compiling.packing``) from the scheduler, done with;
    returns how many members were taken over (``None``: no tables, or the scheduler did not say)."""
    if not compiled.claim_tables:
        return None
    import contextlib

    import time

    from ..bounded import CLEANUP_SECONDS, within
    from ..compiling.packing import forget_claims, takeovers_on_scheduler

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
