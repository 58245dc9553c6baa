"""Shared fixtures: one real LocalCluster (worker processes on loopback) per test session."""

from __future__ import annotations

import shutil
import os

import pytest


@pytest.fixture(scope="session")
def client():
    """A real 2-worker, 1-thread-each LocalCluster with worker processes, shared by the tests."""
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def log_dir(tmp_path):
    """A directory where steps record each execution (one file per execution)."""
    d = tmp_path / "executions"
    d.mkdir()
    yield str(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def workers_per_gpu() -> int:
    """dask-cuda workers per GPU for the GPU tests' clusters: ``QUIVER_TEST_WORKERS_PER_GPU``
    (default 1, dask-cuda's one per GPU). ``benchmarks/gpu_check.sh`` runs the ``gpu`` tests
    with 1, then 2, so a one-GPU machine exercises the cross-worker path too."""
    raw = os.environ.get("QUIVER_TEST_WORKERS_PER_GPU", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise pytest.UsageError(f"QUIVER_TEST_WORKERS_PER_GPU={raw!r}: set it to a whole number >= 1 (e.g. 2)")
    return n


def has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Test files whose every test is slow (a cluster of their own per test, subprocess runs of
# examples or the CLI, training, browsers, namespaced hosts): `make test-fast` (pytest -m "not
# slow") leaves them out. A new slow test elsewhere takes @pytest.mark.slow itself.
SLOW_FILES = {
    "test_allreduce.py": "LocalClusters of its own, collectives over TCP and UCX",
    "test_big_table_example.py": "writes and explores a Parquet table",
    "test_cli.py": "quiver run in subprocesses, each with an embedded cluster",
    "test_cluster_close.py": "starts and closes clusters",
    "test_collections.py": "embedded clusters over Parquet partitions",
    "test_dashboard.py": "scheduler pages over HTTP during runs",
    "test_dashboard_browser.py": "headless Chromium",
    "test_digits_example.py": "the 63-branch demo",
    "test_driver.py": "runs that lose workers",
    "test_first_hour.py": "scripts run with python, embedded clusters",
    "test_gang.py": "gangs of long-running tasks",
    "test_iterative.py": "training-style runs with pruning",
    "test_load.py": "thousands of branches",
    "test_memory_budget.py": "budgeted runs on clusters of their own",
    "test_memory_choose.py": "budgeted runs on clusters of their own, a budget that stops one",
    "test_memory_frames.py": "1200 MiB of DataFrames",
    "test_packing.py": "packed training groups, a killed worker",
    "test_prune_run.py": "pruned training runs",
    "test_report.py": "matplotlib reports of real runs",
    "test_store.py": "runs and reruns with a store",
    "test_train.py": "torch training on workers",
    "test_train_faults.py": "a worker killed during training",
    "test_train_iterate.py": "torch training as an iterative step",
    "test_watchdog.py": "runs that stall on purpose",
}

# single slow tests in otherwise quick files (5-18 s each here under load, measured with --durations)
SLOW_TESTS = {
    "test_run.py::test_killing_a_worker_mid_run_gives_the_same_table",
    "test_bad_input.py::test_cli_stops_on_the_same_metric_mistake_unless_keep_going",
    "test_bad_input.py::test_cli_unreachable_scheduler_is_one_line",
    "test_claims.py::test_take_overs_keep_one_trainer_per_member_and_only_empty_busier_packs",
    "test_memory_plan.py::test_deep_chain_plans_without_recursion_error",
    "test_sklearn_search.py::test_each_prefix_fit_runs_once",
}


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        name = f"{item.path.name}::{item.name.split('[')[0]}"
        if (item.path.name in SLOW_FILES or name in SLOW_TESTS) and item.get_closest_marker("slow") is None:
            item.add_marker(slow)
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (no CUDA device on this machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _embedded_cluster_per_run():
    """Tests start and close an embedded cluster per run, as before clusters were kept
    (graph.cluster.embedded): one test's killed worker or paused cluster never reaches the next. The
    tests of keeping (tests/test_cluster_reuse.py) turn it back on, and scripts run as
    subprocesses keep theirs, as users' scripts do."""
    import dask

    with dask.config.set({"quiver.embedded-cluster.idle-timeout": 0}):
        yield
