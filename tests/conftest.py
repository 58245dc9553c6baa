"""Shared fixtures: one real LocalCluster (worker processes on loopback) per test session."""

from __future__ import annotations

import shutil
import os
import time
from typing import Any, Callable

import pytest


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "the condition",
             interval: float = 0.01) -> Any:
    """Wait for an event instead of sleeping for a while: poll ``predicate`` every ``interval``
    s and return its first truthy value; raise ``TimeoutError`` naming ``what`` if none came
    within ``timeout`` s (a safety bound, so a missing event fails the test instead of hanging
    it: never a measure of how fast the event came)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def client():
    """A real 2-worker, 1-thread-each LocalCluster with worker processes, shared by the tests.

    It lives the whole session in each test process, idle between the tests that use it, so it
    starts with the event-loop check and profiler intervals Quiver gives its own embedded clusters
    (``graph.cluster.workerenv.embedded_config``: Dask's health-check diagnostics, no change to
    scheduling or memory). Measured idle over 60 s: 5.7 CPU-s at Dask's defaults, 1.8 with
    these; over a whole ``make test`` (two such clusters, about 14 minutes each) that was about
    100 CPU-s of a CPU-bound suite. Tests that need Dask's defaults start a cluster of their own."""
    import dask
    from distributed import Client, LocalCluster

    from graph.cluster.workerenv import embedded_config

    with dask.config.set(embedded_config()):  # read as the servers start; the tests see Dask's config
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0")
    with cluster, Client(cluster) as c:
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


# A slow test (a cluster of its own, subprocess runs of examples or the CLI, training, browsers,
# namespaced hosts) says so itself: ``pytestmark = pytest.mark.slow`` in a file whose every test
# is, ``@pytest.mark.slow`` on one test; `make test-fast` (pytest -m "not slow") leaves them out.


def pytest_collection_modifyitems(config, items):
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
