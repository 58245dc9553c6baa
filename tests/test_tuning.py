"""Replica auto-tuner and network-sized partial synchronisation (pure logic)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.tuning import (
    PartitionedSync,
    ReplicaTuner,
    choose_partitions,
    exchange_seconds,
    partition_bounds,
)


def drive(tuner: ReplicaTuner, throughput) -> ReplicaTuner:
    """A live loop in miniature."""
    proposals = 0
    while (k := tuner.propose()) is not None:
        assert 1 <= k <= tuner.max_replicas
        tuner.observe(k, throughput(k))
        proposals += 1
        assert proposals <= tuner.max_replicas
    return tuner


# --- ReplicaTuner ---------------------------------------------------------------------------------
def test_rising_then_flat_stops_at_last_improving_count():
    rates = {1: 100.0, 2: 180.0, 3: 250.0, 4: 260.0, 5: 262.0, 6: 263.0}
    t = drive(ReplicaTuner(threshold=0.10, max_replicas=6), rates.__getitem__)
    assert t.done and t.best == 3
    assert t.curve == [(1, 100.0), (2, 180.0), (3, 250.0), (4, 260.0)]
    assert t.best_throughput == 250.0


def test_monotone_rising_stops_at_max_replicas():
    seen = []
    t = drive(ReplicaTuner(max_replicas=5), lambda k: seen.append(k) or 100.0 * 2**k)
    assert t.best == 5 and seen == [1, 2, 3, 4, 5]


def test_falling_curve_keeps_one_replica():
    t = drive(ReplicaTuner(max_replicas=8), lambda k: 100.0 / k)
    assert t.best == 1 and len(t.curve) == 2


def test_threshold_is_strict_improvement():
    t = drive(ReplicaTuner(threshold=0.5, max_replicas=4), {1: 100.0, 2: 150.0}.__getitem__)
    assert t.best == 1  # exactly +50% is not "more than" 50%


@settings(max_examples=100, deadline=None)
@given(
    knee=st.integers(1, 5),  # below the knee each step adds >= 20% (> 10% even with the noise)
    max_replicas=st.integers(1, 12),
    noise=st.lists(st.floats(-0.03, 0.03), min_size=13, max_size=13),
)
def test_noisy_knee_is_found_and_max_never_exceeded(knee, max_replicas, noise):
    """Throughput ∝ min(k, knee) with ±3% noise: the tuner settles on min(knee, max_replicas)."""
    t = drive(ReplicaTuner(threshold=0.10, max_replicas=max_replicas), lambda k: 100.0 * min(k, knee) * (1 + noise[k]))
    assert t.best == min(knee, max_replicas)
    assert max(k for k, _ in t.curve) <= max_replicas


@settings(max_examples=100, deadline=None)
@given(rates=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=10), threshold=st.floats(0.0, 1.0))
def test_best_is_the_last_improving_count_on_any_curve(rates, threshold):
    max_replicas = len(rates)
    t = drive(ReplicaTuner(threshold=threshold, max_replicas=max_replicas), lambda k: rates[k - 1])
    # recompute the rule directly
    best = 1
    for k in range(2, max_replicas + 1):
        if rates[k - 1] > rates[best - 1] * (1 + threshold):
            best = k
        else:
            break
    assert t.best == best
    assert [k for k, _ in t.curve] == list(range(1, len(t.curve) + 1))


def test_tuner_misuse_and_bad_values():
    t = ReplicaTuner(max_replicas=2, start=2)
    assert t.propose() == 2
    with pytest.raises(ValueError, match="proposed 2"):
        t.observe(3, 10.0)
    with pytest.raises(ValueError, match="throughput"):
        t.observe(2, float("nan"))
    t.observe(2, 10.0)
    assert t.done and t.propose() is None
    with pytest.raises(RuntimeError, match="done"):
        t.observe(3, 10.0)
    with pytest.raises(ValueError, match="threshold"):
        ReplicaTuner(threshold=-0.1)
    with pytest.raises(ValueError, match="max_replicas"):
        ReplicaTuner(max_replicas=1, start=2)


# --- choose_partitions ------------------------------------------------------------------------------
def test_partitions_one_when_model_fits():
    assert choose_partitions(1e6, bandwidth=1e9, latency=1e-5, compute_seconds=0.01) == 1


def test_partitions_examples():
    # 100 MB at 1 GB/s is 0.1 s; 0.01 s of compute hides a tenth of it
    assert choose_partitions(1e8, bandwidth=1e9, latency=0.0, compute_seconds=0.01) == 10
    # latency eats into the budget: 1e8 / (1e9 · 0.009) = 11.1 -> 12
    assert choose_partitions(1e8, bandwidth=1e9, latency=0.001, compute_seconds=0.01) == 12
    # latency alone exceeds the compute: smallest messages
    assert choose_partitions(1e8, bandwidth=1e9, latency=0.05, compute_seconds=0.01, max_partitions=32) == 32


sizes = st.floats(1e3, 1e10)
bandwidths = st.floats(1e6, 1e11)
latencies = st.floats(0.0, 1e-2)
computes = st.floats(1e-4, 1.0)


@settings(max_examples=200, deadline=None)
@given(m=sizes, bw=bandwidths, lat=latencies, comp=computes)
def test_chosen_p_is_the_fewest_that_fits(m, bw, lat, comp):
    cap = 1 << 20
    p = choose_partitions(m, bw, lat, comp, max_partitions=cap)
    assert 1 <= p <= cap
    if exchange_seconds(m / p, bw, lat) <= comp:
        assert p == 1 or exchange_seconds(m / (p - 1), bw, lat) > comp
    else:
        assert p == cap  # nothing fits; the cap is the best there is


@settings(max_examples=200, deadline=None)
@given(m1=sizes, m2=sizes, bw1=bandwidths, bw2=bandwidths, lat=latencies, comp=computes)
def test_p_grows_with_model_size_and_shrinking_bandwidth(m1, m2, bw1, bw2, lat, comp):
    small, big = sorted((m1, m2))
    slow, fast = sorted((bw1, bw2))
    assert choose_partitions(small, fast, lat, comp) <= choose_partitions(big, fast, lat, comp)
    assert choose_partitions(small, fast, lat, comp) <= choose_partitions(small, slow, lat, comp)


def test_choose_partitions_bad_values_name_the_parameter():
    with pytest.raises(ValueError, match="bandwidth"):
        choose_partitions(1e6, bandwidth=0.0, latency=0.0, compute_seconds=1.0)
    with pytest.raises(ValueError, match="model_bytes"):
        choose_partitions(0, bandwidth=1e9, latency=0.0, compute_seconds=1.0)
    with pytest.raises(ValueError, match="latency"):
        choose_partitions(1e6, bandwidth=1e9, latency=-1.0, compute_seconds=1.0)
    with pytest.raises(ValueError, match="compute_seconds"):
        choose_partitions(1e6, bandwidth=1e9, latency=0.0, compute_seconds=math.inf)


# --- partition_bounds / PartitionedSync -------------------------------------------------------------
@given(n=st.integers(1, 500), p=st.integers(1, 50))
def test_partitions_tile_the_vector(n, p):
    if p > n:
        with pytest.raises(ValueError, match="partitions"):
            partition_bounds(n, p, 0)
        return
    bounds = [partition_bounds(n, p, i) for i in range(p)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes_ = [stop - start for start, stop in bounds]
    assert max(sizes_) - min(sizes_) <= 1 and min(sizes_) >= 1


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 40),
    p=st.integers(1, 40),
    rounds=st.integers(0, 30),
    seed=st.integers(0, 2**16),
)
def test_pending_plus_sent_equals_produced(n, p, rounds, seed):
    p = min(p, n)
    g = torch.Generator().manual_seed(seed)
    ps = PartitionedSync(n, p, dtype=torch.float64)
    produced = torch.zeros(n, dtype=torch.float64)
    sent = torch.zeros(n, dtype=torch.float64)
    for r in range(rounds):
        c = torch.randint(-1000, 1000, (n,), generator=g).double()  # integers: exact in float64
        produced += c
        part = ps.exchange(c)
        assert part.index == r % p
        assert (part.start, part.stop) == partition_bounds(n, p, r % p)
        assert torch.equal(ps.pending[part.start : part.stop], torch.zeros(part.stop - part.start, dtype=torch.float64))
        sent += part.dense(n)
        assert torch.equal(ps.pending + sent, produced)
    sent += ps.flush()
    assert torch.equal(sent, produced) and not ps.pending.any()


@given(n=st.integers(1, 30), p=st.integers(1, 30))
def test_one_production_is_sent_exactly_once_over_p_rounds(n, p):
    p = min(p, n)
    ps = PartitionedSync(n, p, dtype=torch.float64)
    produced = torch.arange(1, n + 1, dtype=torch.float64)
    times_sent = torch.zeros(n, dtype=torch.int64)
    total = torch.zeros(n, dtype=torch.float64)
    for r in range(p):
        part = ps.exchange(produced if r == 0 else torch.zeros(n, dtype=torch.float64))
        times_sent[part.start : part.stop] += 1
        total += part.dense(n)
    assert torch.equal(times_sent, torch.ones(n, dtype=torch.int64))
    assert torch.equal(total, produced) and not ps.pending.any()


def test_partitioned_sync_drives_sma_central_update():
    """Wiring check: dense(n, allreduced) feeds apply_central; everything reaches z eventually."""
    from gpu.sma import SMAConfig, SMAState, central_update

    n, p = 6, 3
    cfg = SMAConfig(central_momentum=0.0)
    full = SMAState(z=torch.zeros(n, dtype=torch.float64))
    part_state = SMAState(z=torch.zeros(n, dtype=torch.float64))
    ps = PartitionedSync(n, p, dtype=torch.float64)
    for r in range(5):
        c = torch.full((n,), float(r + 1), dtype=torch.float64)
        central_update(full, c, cfg)
        part = ps.exchange(c)
        central_update(part_state, part.dense(n, part.values * 1.0), cfg)  # values * 1: the "all-reduce"
    central_update(part_state, ps.flush(), cfg)
    torch.testing.assert_close(part_state.z, full.z)


def test_partitioned_sync_bad_input():
    with pytest.raises(ValueError, match="partitions=5 exceeds numel=4"):
        PartitionedSync(4, 5)
    ps = PartitionedSync(4, 2)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        ps.exchange(torch.zeros(3))
