"""Issue 44 item 2: a worker lost mid-task is the machinery's fault, not the step's: Dask runs the
task again (bounded by ``distributed.scheduler.allowed-failures``), the branch succeeds, and the
table's ``retries`` and ``stats["infrastructure_retries"]`` count the attempt."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster

from pipelines import Pipeline

pytestmark = pytest.mark.slow  # a cluster of its own whose worker dies


def _load():
    return 1.0


def _dies_once(x, flag):
    """Kills its worker's process the first time it runs (while ``flag`` exists)."""
    import os

    if os.path.exists(flag):
        os.remove(flag)
        os._exit(1)
    return {"v": x * 2}


def _fine(x):
    return {"v": x}


def test_a_task_whose_worker_died_is_run_again_and_counted_not_charged_to_its_branch(tmp_path):
    flag = tmp_path / "die"
    flag.write_text("")
    node = (Pipeline("lost").source(_load)
            .explore("step", dies=lambda x: _dies_once(x, str(flag)), fine=_fine).choose("v", k=2))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        result = node.run(client, progress=False, quiet=True)
    table = result.table.set_index("step")
    assert not flag.exists()  # the step did kill its worker once
    assert table.at["dies", "status"] == "ok" and table.at["dies", "v"] == 2.0
    assert table.at["dies", "retries"] == 1 and table.at["fine", "retries"] == 0
    assert result.stats["infrastructure_retries"] == 1
