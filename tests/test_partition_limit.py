"""Ako's partition bound (gpu.tuning.partition_limit): every slice is exchanged often enough to learn.

Pure logic, literal inputs and hypothesis; the rotation it relies on is PartitionedSync's own."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.tuning import PartitionedSync, choose_partitions, partition_limit


def test_literal_values():
    # the measurement: 15 sync rounds an epoch, the bandwidth rule wanted 1024
    assert partition_limit(15) == 3
    assert partition_limit(15, exchanges_per_epoch=1) == 15
    assert partition_limit(62) == 15
    assert partition_limit(4) == 1 and partition_limit(3) == 1 and partition_limit(1) == 1
    assert partition_limit(1000, exchanges_per_epoch=8) == 125


def test_caps_what_the_bandwidth_rule_chooses():
    # 20 Mbit/s (2.5 MB/s), a 0.8 MB model, 5 ms of compute: the bandwidth rule alone wants 1024
    wanted = choose_partitions(814_000, bandwidth=2.5e6, latency=0.01, compute_seconds=0.005)
    assert wanted == 1024
    capped = choose_partitions(814_000, bandwidth=2.5e6, latency=0.01, compute_seconds=0.005,
                               max_partitions=partition_limit(15))
    assert capped == 3
    # and a model that fits is never split, whatever the bound allows
    assert choose_partitions(1000, 1e9, 1e-4, 0.01, max_partitions=partition_limit(500)) == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4", None])
def test_bad_values_name_the_parameter(bad):
    with pytest.raises(ValueError, match="rounds_per_epoch"):
        partition_limit(bad)
    with pytest.raises(ValueError, match="exchanges_per_epoch"):
        partition_limit(10, exchanges_per_epoch=bad)


@settings(max_examples=200, deadline=None)
@given(rounds=st.integers(1, 5000), per_epoch=st.integers(1, 64))
def test_the_bound_is_the_largest_that_keeps_the_exchanges(rounds, per_epoch):
    p = partition_limit(rounds, exchanges_per_epoch=per_epoch)
    assert p >= 1
    if rounds >= per_epoch:
        assert p * per_epoch <= rounds < (p + 1) * per_epoch  # largest such p
    else:
        assert p == 1  # too few rounds for the requirement: no split at all


@settings(max_examples=60, deadline=None)
@given(rounds=st.integers(1, 300), per_epoch=st.integers(1, 10), numel=st.integers(1, 200))
def test_every_slice_is_really_exchanged_that_often_in_one_epoch(rounds, per_epoch, numel):
    """Drive PartitionedSync for one epoch's rounds at the bound: each element leaves (a nonzero
    value is sent for it) at least ``per_epoch`` times, or every round when p is 1."""
    p = min(partition_limit(rounds, exchanges_per_epoch=per_epoch), numel)
    sync = PartitionedSync(numel, p, dtype=torch.float64)
    sends = torch.zeros(numel, dtype=torch.long)
    for _ in range(rounds):
        part = sync.exchange(torch.ones(numel, dtype=torch.float64))
        sends[part.start:part.stop] += (part.values != 0).long()
    assert int(sends.min()) >= min(per_epoch, rounds)


@settings(max_examples=60, deadline=None)
@given(numel=st.integers(1, 100), p=st.integers(1, 20), q=st.integers(1, 20), rounds=st.integers(0, 30))
def test_repartition_loses_nothing(numel, p, q, rounds):
    p, q = min(p, numel), min(q, numel)
    a = PartitionedSync(numel, p, dtype=torch.float64)
    sent = torch.zeros(numel, dtype=torch.float64)
    produced = torch.zeros(numel, dtype=torch.float64)
    for r in range(rounds):
        c = torch.full((numel,), float(r + 1), dtype=torch.float64)
        produced += c
        part = a.exchange(c)
        sent += part.dense(numel)
    b = a.repartition(q)
    assert b.partitions == q and b.round == 0
    assert torch.equal(b.pending + sent, produced)
    c = torch.ones(numel, dtype=torch.float64)
    sent += b.exchange(c).dense(numel)
    assert torch.allclose(b.pending + sent, produced + c)


def test_latest_sends_the_current_correction_of_each_slice():
    ps = PartitionedSync(numel=4, partitions=2, dtype=torch.float64, combine="latest")
    assert ps.exchange(torch.tensor([1.0, 1.0, 1.0, 1.0])).values.tolist() == [1.0, 1.0]
    # slice 1 waited a round: it carries this round's correction, not the sum of both
    assert ps.exchange(torch.tensor([2.0, 2.0, 3.0, 4.0])).values.tolist() == [3.0, 4.0]
    assert ps.pending.tolist() == [2.0, 2.0, 0.0, 0.0]
    assert ps.repartition(4).combine == "latest"
    assert ps.flush().tolist() == [2.0, 2.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="combine='mean'"):
        PartitionedSync(4, 2, combine="mean")


@settings(max_examples=60, deadline=None)
@given(numel=st.integers(1, 60), p=st.integers(1, 12), rounds=st.integers(1, 40), seed=st.integers(0, 99))
def test_latest_slice_equals_that_rounds_correction(numel, p, rounds, seed):
    p = min(p, numel)
    g = torch.Generator().manual_seed(seed)
    ps = PartitionedSync(numel, p, dtype=torch.float64, combine="latest")
    for _ in range(rounds):
        c = torch.randn(numel, generator=g, dtype=torch.float64)
        part = ps.exchange(c)
        assert torch.equal(part.values, c[part.start:part.stop])
        rest = torch.ones(numel, dtype=torch.bool)
        rest[part.start:part.stop] = False
        assert torch.equal(ps.pending[rest], c[rest]) and not ps.pending[~rest].any()
