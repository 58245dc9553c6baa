"""The process environment a run's steps see on a worker is what graph.cluster.workerenv's rule says:
Quiver's mmap threshold on embedded clusters (so mid-sized arrays are not an mmap/munmap pair
each, as Dask's trim setting alone makes them), Dask's own under a memory budget, and Dask's
thread limits everywhere. Read from inside real tasks on real worker processes."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster

from graph.cluster.workerenv import DASK_MMAP_THRESHOLD, MMAP_THRESHOLD, embedded_environ, mmap_threshold, probe_environment, tune_workers
from pipelines import Pipeline
from tests.env_steps import probe

pytestmark = pytest.mark.skipif(probe_environment()["mmapped"] is None, reason="needs glibc's mallinfo2")


@pytest.fixture(autouse=True)
def _workers_only():
    # the workers' environment: a new cluster's first tasks may otherwise run in this process,
    # whose environment is its own (graph.cluster.bridge; its own test: tests/test_bridge.py)
    with dask.config.set({"quiver.embedded-cluster.bridge": False}):
        yield


def _run(**options) -> dict:
    p = Pipeline("env")
    return p.source(probe, seed=1).run(quiet=True, progress=False, workers=1, **options).value


def test_embedded_workers_get_the_mmap_threshold(monkeypatch):
    # a nanny that restarted a worker of a budgeted cluster leaves Dask's value in this
    # process's environment, which Dask lets override its config: the configured one still wins
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(DASK_MMAP_THRESHOLD))
    seen = _run()
    assert seen["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD)
    assert seen["MALLOC_TRIM_THRESHOLD_"] == "65536"  # Dask's own stays: the heap's free top goes back
    assert seen["mmapped"] is False  # a 1 MiB array comes from the heap, as in a plain process
    assert seen["OMP_NUM_THREADS"] == "1"  # Dask's thread limit for a single-threaded worker


def test_a_memory_budget_keeps_dasks_allocator_setting():
    seen = _run(memory_budget="1200 MiB")
    assert seen["MALLOC_MMAP_THRESHOLD_"] == str(DASK_MMAP_THRESHOLD)
    assert seen["mmapped"] is True  # memory returned to the system first, as the budget wants
    assert seen["arrow_pool"] == "system"  # pyarrow's freed buffers too (its own pool keeps them)


def test_pyarrow_keeps_its_own_pool_without_a_budget_and_gets_it_back_after_one():
    from graph.memory.workmeter import WorkingMemoryPlugin

    assert _run()["arrow_pool"] != "system"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc) as c:
        own = c.submit(probe, 1, pure=False).result()["arrow_pool"]
        c.register_plugin(WorkingMemoryPlugin("test-working"))  # what a budgeted run installs
        during = c.submit(probe, 2, pure=False).result()["arrow_pool"]
        c.unregister_worker_plugin("test-working")  # the run's end
        after = c.submit(probe, 3, pure=False).result()["arrow_pool"]
    assert own != "system" and during == "system" and after == own


def test_the_config_turns_it_off():
    with dask.config.set({"quiver.worker.mmap-threshold": 0}):
        assert embedded_environ() == {"MALLOC_MMAP_THRESHOLD_": str(DASK_MMAP_THRESHOLD)}
        seen = _run()
    assert seen["MALLOC_MMAP_THRESHOLD_"] == str(DASK_MMAP_THRESHOLD) and seen["mmapped"] is True


def test_a_bad_threshold_is_refused_with_the_fix():
    with dask.config.set({"quiver.worker.mmap-threshold": "64 MiB"}), \
            pytest.raises(ValueError, match=r"\(0, 32 MiB\].*0 for Dask's own"):
        mmap_threshold()


def test_this_process_keeps_its_own_environment():
    import os

    before = {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "OMP_NUM_THREADS")}
    _run()
    assert {k: os.environ.get(k) for k in before} == before  # Dask's nanny wrote them here; put back


def test_tune_workers_sets_it_on_a_running_cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        assert c.submit(probe_environment, pure=False).result()["mmapped"] is True  # Dask's worker
        tune_workers(c)
        after = c.submit(probe_environment, pure=False).result()
        assert after["mmapped"] is False and after["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD)


def test_embedded_workers_sample_the_profiler_every_100ms_unless_told():
    from tests.env_steps import profiler

    def sampled() -> float:
        return Pipeline("prof").source(profiler, seed=1).run(quiet=True, progress=False, workers=1).value["profile_ms"]

    assert sampled() == 100  # Dask's 10 ms cost the fits 3-5% of their cores (docs/guide/speed.md)
    with dask.config.set({"quiver.worker.profile-interval": False}):
        assert sampled() == 10  # Dask's own
    with dask.config.set({"distributed.worker.profile.interval": "20ms"}):
        assert sampled() == 20  # a user's own setting wins
    with dask.config.set({"quiver.worker.profile-interval": "soon"}), pytest.raises(ValueError, match="'100ms'"):
        sampled()


def test_embedded_clusters_check_their_event_loops_every_200ms_unless_told():
    from tests.env_steps import profiler

    def tick() -> float:
        return Pipeline("tick").source(profiler, seed=1).run(quiet=True, progress=False, workers=1).value["tick_ms"]

    assert tick() == 200  # Dask's 20 ms: 75 CPU-ms per second of an idle 2-worker cluster (graph/cluster/workerenv.py)
    with dask.config.set({"quiver.worker.tick-interval": False}):
        assert tick() == 20  # Dask's own
    with dask.config.set({"distributed.admin.tick.interval": "50ms"}):
        assert tick() == 50  # a user's own setting wins
    with dask.config.set({"quiver.worker.tick-interval": "never"}), pytest.raises(ValueError, match="'200ms'"):
        tick()


def test_tune_workers_slows_a_running_clusters_profiler():
    from tests.env_steps import profiler

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        assert c.submit(profiler, 1, pure=False).result()["profile_ms"] == 10  # Dask's worker
        tune_workers(c)
        assert c.submit(profiler, 1, pure=False).result()["profile_ms"] == 100


def test_a_memory_budget_runs_its_workers_without_the_profiler_unless_told():
    from tests.env_steps import profiler

    def sampled(**options) -> float | None:
        p = Pipeline("prof").source(profiler, seed=1)
        return p.run(quiet=True, progress=False, workers=1, **options).value["profile_ms"]

    # Dask keeps each second's profile for 1,000 s: unmanaged memory a budget cannot plan
    assert sampled(memory_budget="1200 MiB") is None
    with dask.config.set({"quiver.worker.profile-under-budget": True}):
        assert sampled(memory_budget="1200 MiB") == 100


def test_the_shared_test_cluster_checks_its_loops_as_embedded_ones_and_leaves_the_config_alone(client):
    """tests/conftest.py's session cluster idles most of the session: it starts with Quiver's
    embedded intervals, and the config the other tests read is still Dask's own."""
    from tests.env_steps import profiler

    r = client.submit(profiler, 1, pure=False).result()
    assert (r["tick_ms"], r["profile_ms"]) == (200, 100)
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"
    assert dask.config.get("distributed.worker.profile.interval") == "10ms"
