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


def has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (no CUDA device on this machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
