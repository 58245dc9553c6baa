"""Steps for tests/test_worker_env.py: what a step sees of its worker process."""

from __future__ import annotations


def probe(seed: int) -> dict:
    """The allocator and thread settings this task's process runs with (a 1 MiB allocation's
    path measured with glibc's counters), and ``m`` for a choose."""
    import pyarrow

    from graph.cluster.workerenv import probe_environment

    return dict(probe_environment(), m=float(seed), arrow_pool=pyarrow.default_memory_pool().backend_name)


def profiler(seed: int) -> dict:
    """How often this task's worker samples its threads for Dask's profiler (ms; None: off)."""
    from gpu.worker import current_worker

    worker = current_worker()
    pc = worker.periodic_callbacks.get("profile")
    tick = worker.periodic_callbacks.get("tick")
    return {"profile_ms": None if pc is None else pc.callback_time, "m": float(seed),
            "tick_ms": None if tick is None else tick.callback_time}
