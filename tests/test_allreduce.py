"""Collectives across real worker processes (gpu.allreduce): sums, broadcast, failures, UCX.

Member functions live at module top level so the spawned workers can import them.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import numpy as np
import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.allreduce import Collective, CollectiveError, measure_bandwidth
from gpu.gang import GangError, run_gang
from gpu.schedules import (
    Transfer,
    broadcast,
    rank_plan,
    ring_allreduce,
    simulate,
    tree_allreduce,
    tree_reduce,
)

pytestmark = pytest.mark.slow  # LocalClusters of its own, collectives over TCP and UCX

# ------------------------------------------------------------------ pure schedules, in memory


def test_ring_of_three_literal_sums():
    ranks = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, 40.0]),
             np.array([100.0, 200.0, 300.0, 400.0])]
    for got in simulate(ring_allreduce(4, 3), ranks):
        assert got.tolist() == [111.0, 222.0, 333.0, 444.0]
    assert ranks[0].tolist() == [1.0, 2.0, 3.0, 4.0]  # inputs untouched


def test_ring_of_two_literal_schedule():
    # 5 elements, 2 ranks: chunks [0, 3) and [3, 5); rank 1 ends the reduce-scatter owning
    # chunk 0, rank 0 chunk 1; the all-gather swaps them
    assert ring_allreduce(5, 2) == (
        (Transfer(0, 1, 0, 3, "add"), Transfer(1, 0, 3, 5, "add")),
        (Transfer(0, 1, 3, 5, "set"), Transfer(1, 0, 0, 3, "set")),
    )


def test_tree_of_five_literal_schedule_and_sums():
    assert tree_reduce(1, 5) == (
        (Transfer(1, 0, 0, 1, "add"), Transfer(3, 2, 0, 1, "add")),
        (Transfer(2, 0, 0, 1, "add"),),
        (Transfer(4, 0, 0, 1, "add"),),
    )
    got = simulate(tree_allreduce(2, 5), [np.array([r, 10 * r]) for r in range(5)])
    assert [g.tolist() for g in got] == [[10, 100]] * 5


def test_broadcast_from_root_two_of_five():
    got = simulate(broadcast(3, 5, root=2), [np.full(3, r) for r in range(5)])
    assert [g.tolist() for g in got] == [[2, 2, 2]] * 5


def test_schedules_reject_bad_sizes():
    with pytest.raises(ValueError, match="ranks"):
        ring_allreduce(3, 0)
    with pytest.raises(ValueError, match="elements"):
        tree_allreduce(-1, 2)
    with pytest.raises(ValueError, match="root"):
        broadcast(3, 2, root=2)


def _check_schedule_shape(schedule, n, p):
    """At most one receive per rank per round; no rank sends what it receives in that round;
    every transfer within [0, n) between two distinct ranks."""
    for rnd in schedule:
        dsts = [t.dst for t in rnd]
        assert len(dsts) == len(set(dsts))
        for t in rnd:
            assert 0 <= t.src < p and 0 <= t.dst < p and t.src != t.dst
            assert 0 <= t.start <= t.stop <= n and t.op in ("add", "set")
            for u in rnd:  # a concurrent send and receive on one rank touch disjoint elements
                if u.src == t.dst:
                    assert u.stop <= t.start or t.stop <= u.start or u.start == u.stop or t.start == t.stop
        for r in range(p):
            rank_plan(schedule, r)  # raises on two receives


@settings(max_examples=200, deadline=None)
@given(p=st.integers(1, 9), n=st.integers(0, 40), algorithm=st.sampled_from(["ring", "tree"]),
       seed=st.integers(0, 2**16))
def test_allreduce_schedules_sum_exactly_and_agree_bitwise(p, n, algorithm, seed):
    schedule = ring_allreduce(n, p) if algorithm == "ring" else tree_allreduce(n, p)
    _check_schedule_shape(schedule, n, p)
    rng = np.random.default_rng(seed)
    ints = [rng.integers(-1000, 1000, size=n).astype(np.float64) for _ in range(p)]
    for got in simulate(schedule, ints):  # integers: the sum is exact whatever the order
        np.testing.assert_array_equal(got, sum(ints) if p > 1 else ints[0])
    floats = [rng.standard_normal(n).astype(np.float32) for _ in range(p)]
    got = simulate(schedule, floats)
    np.testing.assert_allclose(got[0], np.sum(floats, axis=0), rtol=1e-5, atol=1e-5)
    for other in got[1:]:  # bit-identical on every rank: SMA applies one Δ everywhere
        np.testing.assert_array_equal(other, got[0])
    rounds = len(schedule)
    if p > 1:
        assert rounds == (2 * (p - 1) if algorithm == "ring" else 2 * (p - 1).bit_length())
        if algorithm == "ring":  # bandwidth-optimal: each rank sends 2(p-1) chunks of ceil(n/p) at most
            for r in range(p):
                sent = [t.stop - t.start for rnd in schedule for t in rnd if t.src == r]
                assert len(sent) == 2 * (p - 1) and max(sent) <= -(-n // p)


@settings(max_examples=100, deadline=None)
@given(p=st.integers(1, 9), n=st.integers(0, 10), data=st.data())
def test_broadcast_schedule_copies_the_root_everywhere(p, n, data):
    root = data.draw(st.integers(0, p - 1))
    schedule = broadcast(n, p, root)
    _check_schedule_shape(schedule, n, p)
    got = simulate(schedule, [np.full(n, r) for r in range(p)])
    assert all(g.tolist() == [root] * n for g in got)
    # every rank but the root receives exactly once
    assert sorted(t.dst for rnd in schedule for t in rnd) == [r for r in range(p) if r != root]


# numbers of elements: a tiny one, fewer than ranks, non-divisible by 2 and 3, > one segment
SIZES = [1, 2, 7, 1000, 4099, (1 << 18) + 3]
SEED = 1234


def local_inputs(n: int, rank: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(SEED + 7919 * rank + n)).to(dtype)


def allreduce_member(ctx, sizes, algorithm):
    """Every size, float32 and float64, a 2-D non-contiguous view, small segments once."""
    c = ctx.collective
    c.algorithm = algorithm
    out = {}
    for n in sizes:
        for dtype in (torch.float32, torch.float64):
            t = local_inputs(n, ctx.rank, dtype)
            assert c.allreduce_(t) is t
            out[n, str(dtype)] = t.numpy().copy()
    m = local_inputs(12, ctx.rank).reshape(3, 4).t()  # non-contiguous
    c.allreduce_(m)
    out["transposed"] = m.numpy().copy()
    c.segment_bytes = 1000  # 4099 float32 elements -> several messages per chunk
    t = local_inputs(4099, ctx.rank)
    c.allreduce_(t)
    out["segmented"] = t.numpy().copy()
    return out, c.stats()


def check_allreduce(results, size, sizes):
    for n in sizes:
        for dtype in (torch.float32, torch.float64):
            expected = sum(local_inputs(n, r, dtype) for r in range(size)).numpy()
            got = [res[n, str(dtype)] for res, _ in results]
            np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)
            for other in got[1:]:  # bit-identical on every rank (SMA keeps z equal everywhere)
                np.testing.assert_array_equal(other, got[0])
    expected = sum(local_inputs(12, r).reshape(3, 4).t() for r in range(size)).numpy()
    seg = sum(local_inputs(4099, r) for r in range(size)).numpy()
    for res, stats in results:
        np.testing.assert_allclose(res["transposed"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res["segmented"], seg, rtol=1e-5, atol=1e-5)
        assert stats["bytes_sent"] > 0 and stats["bytes_received"] > 0 and stats["seconds"] > 0


@pytest.mark.parametrize("algorithm", ["ring", "tree", "auto"])
def test_allreduce_two_workers_equals_local_sum(client, algorithm):
    results = run_gang(client, allreduce_member, None, SIZES, algorithm, timeout=30)
    check_allreduce(results, 2, SIZES)


def big_member(ctx, n, algorithm):
    """Tens of MB, reused at once: the buffer is overwritten right after each call returns,
    as SMA's optimiser does (a send still reading it would corrupt the peer's sum)."""
    c = ctx.collective
    c.algorithm = algorithm
    out = []
    t = torch.empty(n)
    for round_ in range(3):
        t.copy_(local_inputs(n, ctx.rank) + round_)
        c.allreduce_(t)
        out.append(t.numpy().copy())
        t.fill_(-1.0)  # overwrite immediately
    return out


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_allreduce_tens_of_megabytes_with_immediate_reuse(client, algorithm):
    n = 6_000_001  # 24 MB of float32, not divisible by 2 or 3
    results = run_gang(client, big_member, None, n, algorithm, timeout=60)
    for round_ in range(3):
        expected = (sum(local_inputs(n, r) for r in range(2)) + 2 * round_).numpy()
        np.testing.assert_allclose(results[0][round_], expected, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(results[1][round_], results[0][round_])


@pytest.fixture(scope="module")
def client3():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        yield c


def test_allreduce_three_workers_ring_and_tree(client3):
    sizes = [1, 2, 3, 7, 4099]
    for algorithm in ("ring", "tree"):
        results = run_gang(client3, allreduce_member, None, sizes, algorithm, timeout=30)
        check_allreduce(results, 3, sizes)


def broadcast_member(ctx):
    out = []
    for root in range(ctx.size):
        t = torch.full((5,), float(ctx.rank)) + torch.arange(5.0)
        ctx.collective.broadcast_(t, root=root)
        out.append(t.tolist())
    ctx.collective.barrier()
    return out


def test_broadcast_from_every_root(client3):
    results = run_gang(client3, broadcast_member, timeout=30)
    for got in results:
        assert got == [[float(root + i) for i in range(5)] for root in range(3)]


def bandwidth_member(ctx):
    profile = measure_bandwidth(ctx.collective, [1024, 1 << 16], repeats=2)
    return profile


def test_measure_bandwidth_agrees_across_ranks(client):
    a, b = run_gang(client, bandwidth_member, timeout=30)
    assert a == b  # the tuner decides the same thing on every worker
    assert [s.nbytes for s in a.samples] == [1024, 1 << 16]
    assert all(s.seconds > 0 and s.bandwidth > 0 for s in a.samples)
    assert a.latency >= 0 and a.bandwidth > 0


def mismatched_member(ctx):
    ctx.collective.allreduce_(torch.ones(10 + ctx.rank))


def test_mismatched_shapes_are_a_clear_error(client):
    with pytest.raises(GangError) as info:
        run_gang(client, mismatched_member, timeout=5)
    assert any("same shape" in str(e) for e in info.value.errors.values())


# ------------------------------------------------------------------------------- failures


def stalling_member(ctx, seconds):
    t = torch.ones(100)
    ctx.collective.allreduce_(t)
    if ctx.rank == 1:
        time.sleep(seconds)  # busy elsewhere, past the other's timeout
    ctx.collective.allreduce_(t)


@pytest.mark.timeout(60)
def test_stalled_peer_gives_collective_error(client):
    with pytest.raises(GangError) as info:
        run_gang(client, stalling_member, None, 3.0, timeout=2)
    err = info.value
    assert err.rank == 1
    waited = err.errors[0]
    assert isinstance(waited, CollectiveError)
    assert waited.peer == 1 and waited.timeout == 2
    assert "timed out after 2 s waiting for rank 1" in str(waited)
    # the stalled member learns it at its next call: rank 0 told it why
    assert isinstance(err.errors[1], CollectiveError) and "aborted" in str(err.errors[1])


def raising_member(ctx):
    t = torch.ones(100)
    ctx.collective.allreduce_(t)
    if ctx.rank == 1:
        raise ValueError("member 1 broke")
    ctx.collective.allreduce_(t)  # rank 0 is waiting here when rank 1 raises


@pytest.mark.timeout(60)
def test_raising_member_fails_the_others_at_once(client):
    with pytest.raises(GangError) as info:
        run_gang(client, raising_member, timeout=30)
    err = info.value
    assert err.rank == 1 and isinstance(err.exception, ValueError)
    assert isinstance(err.errors[0], CollectiveError) and "member 1 broke" in str(err.errors[0])
    # told by rank 1's abort, not by waiting out the 30 s: a timed-out wait says so in its error
    told = str(err.errors[0])
    assert "rank 1 (" in told and "aborted the collective" in told and "timed out" not in told, told
    assert err.errors[0].peer == 1


def killed_member(ctx):
    t = torch.ones(1000)
    ctx.collective.allreduce_(t)
    if ctx.rank == 1:
        time.sleep(0.5)  # rank 0 is inside the next all-reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.collective.allreduce_(t)


@pytest.mark.timeout(90)
def test_killed_worker_gives_collective_error():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        with pytest.raises(GangError) as info:
            run_gang(c, killed_member, timeout=20)
    err = info.value
    assert err.rank == 1
    lost = err.errors[0]
    assert isinstance(lost, CollectiveError) and lost.peer == 1
    assert "rank 1" in str(lost)


def test_single_rank_needs_no_cluster():
    c = Collective(0, 1)
    t = torch.arange(4.0)
    assert c.allreduce_(t) is t and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    c.broadcast_(t, root=0)
    c.barrier()
    c.close()
    with pytest.raises(CollectiveError, match="closed"):
        c.allreduce_(t)
    with pytest.raises(ValueError, match="rank"):
        Collective(2, 2)


def test_multi_rank_outside_a_task_is_a_clear_error():
    with pytest.raises(CollectiveError, match="inside a Dask task"):
        Collective(0, 2)


# ------------------------------------------------------------------------------- UCX


def ucx_member(ctx):
    from distributed import get_worker

    assert ctx.collective.address.startswith("ucxx://")
    assert get_worker().address.startswith("ucxx://")
    out = {}
    for algorithm in ("ring", "tree"):
        ctx.collective.algorithm = algorithm
        for n in (1, 7, 4099):
            t = local_inputs(n, ctx.rank)
            ctx.collective.allreduce_(t)
            out[algorithm, n] = t.numpy().copy()
    b = torch.full((3,), float(ctx.rank))
    ctx.collective.broadcast_(b, root=1)
    out["b"] = b.tolist()
    return out


def _ucx_allreduce() -> None:
    """The UCX run itself, in a process of its own (see the test)."""
    from distributed import Client, LocalCluster

    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="ucxx",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        results = run_gang(c, ucx_member, timeout=30)
    for n in (1, 7, 4099):
        expected = sum(local_inputs(n, r) for r in range(2)).numpy()
        for res in results:
            for algorithm in ("ring", "tree"):
                np.testing.assert_allclose(res[algorithm, n], expected, rtol=1e-5, atol=1e-5)
    assert all(res["b"] == [1.0, 1.0, 1.0] for res in results)
    print("UCX-ALLREDUCE-OK", flush=True)


@pytest.mark.timeout(150)
def test_allreduce_over_ucx():
    if importlib.util.find_spec("distributed_ucxx") is None:
        pytest.skip("distributed-ucxx is not installed (pip install 'quiver[ucx]')")
    try:
        import distributed_ucxx  # noqa: F401
        import ucxx  # noqa: F401
    except Exception as e:  # installed but unusable (no libucx for this platform, ...)
        pytest.skip(f"distributed-ucxx does not import here: {e!r}")
    # the scheduler and client run in a process of their own: UCX's progress thread outlived the
    # cluster in the test process once and crashed it (a segfault) at a later test's start
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("from tests.test_allreduce import _ucx_allreduce\n"
            "if __name__ == '__main__':\n    _ucx_allreduce()\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=140,
                         env=dict(os.environ, PYTHONPATH=str(root)))
    assert out.returncode == 0 and "UCX-ALLREDUCE-OK" in out.stdout, out.stderr[-3000:]


# ------------------------------------------------------------------------------- GPU


def cuda_member(ctx, n):
    import cupy  # noqa: F401  (the device path needs it)

    t = torch.full((n,), float(ctx.rank + 1), device="cuda")
    ctx.collective.allreduce_(t)
    b = torch.full((n,), float(ctx.rank), device="cuda")
    ctx.collective.broadcast_(b, root=0)
    return t.cpu().tolist()[:3], b.cpu().tolist()[:3], t.device.type


@pytest.mark.gpu
@pytest.mark.parametrize("protocol", ["tcp", "ucxx"])
def test_allreduce_cuda_tensors_stay_on_device(protocol, workers_per_gpu):
    """Device buffers all-reduced between dask-cuda workers (gpu.cluster: one per GPU, or
    QUIVER_TEST_WORKERS_PER_GPU of them sharing each) come back summed, still on the device."""
    pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    if protocol == "ucxx" and importlib.util.find_spec("distributed_ucxx") is None:
        pytest.skip("distributed_ucxx is not installed (pip install 'quiver[ucx]')")
    from distributed import Client

    import gpu

    expected_workers = gpu.gpu_count() * workers_per_gpu
    with gpu.cluster(protocol=protocol, use_gpu=True, workers_per_gpu=workers_per_gpu) as cluster, \
            Client(cluster) as c:
        c.wait_for_workers(expected_workers, timeout=60)
        results = run_gang(c, cuda_member, None, 1 << 20, timeout=60)
    size = len(results)
    assert size == expected_workers
    total = float(sum(range(1, size + 1)))
    for t, b, device in results:
        assert t == [total] * 3 and b == [0.0] * 3 and device == "cuda"
