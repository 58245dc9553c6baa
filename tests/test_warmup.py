"""Workers import a run's step modules at its start (graph.cluster.warmup), not when their first
task arrives: evidence from the workers' own import times on a fresh real cluster."""

from __future__ import annotations

from distributed import Client, LocalCluster

from graph.cluster.warmup import step_modules
from pipelines import Pipeline, grid
from tests.warm_source import slow_source
from tests.warm_steps import widen


def _imported(name: str) -> tuple:
    import sys

    from graph.cluster.warmup import imported_by_warmup

    module = sys.modules.get(name)
    return getattr(module, "IMPORTED_AT", None), name in imported_by_warmup


def test_every_worker_imports_the_step_modules_before_its_first_task():
    node = Pipeline("warm").source(slow_source, seconds=2.0).explore("w", grid(widen, a=[1, 2, 3, 4])).choose("m")
    assert "tests.warm_steps" in step_modules(__import__("graph").compile(node))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        result = node.run(c, quiet=True, progress=False)
        source_done = result.table["m"].max() - 4  # slow_source's value: the time it finished
        seen = c.run(_imported, "tests.warm_steps")
    assert len(seen) == 2
    for worker, (imported_at, by_warmup) in seen.items():
        assert by_warmup, f"{worker} imported tests.warm_steps itself, not through the warm-up"
        assert imported_at < source_done, f"{worker} imported the steps' module only after the source finished"
