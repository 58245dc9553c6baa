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
) -> Result:
    import graph
    from graph.cluster import connect
    from graph.executor import execute

    compiled = graph.compile(node)  # compile first: definition errors surface before a cluster starts
    with connect(
        client,
        n_workers=workers,
        threads_per_worker=threads_per_worker,
        memory_limit=memory_limit,
        quiet=quiet,
    ) as c:
        record = execute(compiled, c, progress=progress, raise_if_all_failed=raise_if_all_failed)
    if record.single:
        value = record.values[0] if record.values else None
    else:
        value = record.values
    return Result(table=record.table, value=value, values=record.values, stats=record.stats, compiled=compiled)
