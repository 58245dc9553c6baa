"""Auto-tuning logic, pure (no cluster): replicas per worker, and sync sized to the network.

(a) :class:`ReplicaTuner` — Crossbow's rule: add one replica per worker while measured
throughput (samples/s) rises by more than ``threshold``; keep the last improving count.
A live loop drives it::

    tuner = ReplicaTuner(threshold=0.10, max_replicas=8)
    while (k := tuner.propose()) is not None:
        tuner.observe(k, measure_throughput(k))
    group.resize(tuner.best)

(b) :func:`choose_partitions` and :class:`PartitionedSync` — after Ako (SoCC 2016): when an
all-reduce of the whole model costs more than the compute it overlaps, exchange a rotating
``1/p`` partition of the flat correction vector per round and accumulate the rest, so
nothing is lost and bandwidth use per round stays flat. :func:`partition_limit` bounds ``p``
so that every partition is still exchanged often enough to keep learning.

>>> tuner = ReplicaTuner(max_replicas=4)
>>> for k, rate in [(1, 100.0), (2, 190.0), (3, 200.0)]:
...     assert tuner.propose() == k
...     tuner.observe(k, rate)
>>> tuner.done, tuner.best, tuner.propose()
(True, 2, None)
>>> choose_partitions(model_bytes=4e8, bandwidth=1e9, latency=1e-4, compute_seconds=0.1)
5
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ReplicaTuner",
    "exchange_seconds",
    "choose_partitions",
    "partition_limit",
    "partition_bounds",
    "SyncSlice",
    "PartitionedSync",
    "COMBINES",
]


def _number(name: str, value: object, *, low: float, strict: bool, fix: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low)  # type: ignore[operator]
    if not ok:
        rel = ">" if strict else ">="
        raise ValueError(f"{name}={value!r} must be a finite number {rel} {low}; {fix}")
    return float(value)  # type: ignore[arg-type]


def _int(name: str, value: object, low: int, fix: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} must be an int >= {low}" + (f"; {fix}" if fix else ""))
    return value


class ReplicaTuner:
    """Crossbow's replica auto-tuner as a state machine: ``propose`` / ``observe`` until ``done``.

    Starts at ``start`` replicas and proposes one more each time the last measured
    throughput beat the best so far by more than ``threshold`` (0.10 = 10%). Stops at the
    first count that does not, or at ``max_replicas``. ``best`` is the last improving
    count; ``curve`` the ``(replicas, throughput)`` measurements in order.

    >>> t = ReplicaTuner(threshold=0.1, max_replicas=3)
    >>> t.propose()
    1
    >>> t.observe(1, 50.0); t.observe(2, 100.0); t.observe(3, 200.0)
    >>> t.done, t.best, t.curve
    (True, 3, [(1, 50.0), (2, 100.0), (3, 200.0)])
    """

    def __init__(self, threshold: float = 0.10, max_replicas: int = 16, start: int = 1) -> None:
        self.threshold = _number("threshold", threshold, low=0.0, strict=False, fix="use e.g. threshold=0.10 (10%)")
        self.start = _int("start", start, 1)
        self.max_replicas = _int("max_replicas", max_replicas, self.start, "it must be at least start")
        self.curve: list[tuple[int, float]] = []
        self.best: int = self.start
        self._best_rate: float | None = None
        self._next: int | None = self.start

    @property
    def done(self) -> bool:
        """True once the tuner has settled on ``best``."""
        return self._next is None

    @property
    def best_throughput(self) -> float | None:
        """Throughput measured at ``best`` (``None`` before the first observation)."""
        return self._best_rate

    def propose(self) -> int | None:
        """The replica count to measure next, or ``None`` when done."""
        return self._next

    def observe(self, replicas: int, throughput: float) -> None:
        """Record the throughput (samples/s) measured with ``replicas`` (the proposed count)."""
        if self._next is None:
            raise RuntimeError(f"ReplicaTuner is done (best={self.best}); start a new tuner to tune again")
        if replicas != self._next:
            raise ValueError(f"observe: replicas={replicas!r} but the tuner proposed {self._next}; measure that count")
        rate = _number("throughput", throughput, low=0.0, strict=False, fix="pass the measured samples per second")
        self.curve.append((replicas, rate))
        if self._best_rate is None or rate > self._best_rate * (1.0 + self.threshold):
            self.best, self._best_rate = replicas, rate
            self._next = replicas + 1 if replicas < self.max_replicas else None
        else:
            self._next = None


def exchange_seconds(nbytes: float, bandwidth: float, latency: float) -> float:
    """Modelled time of one all-reduce of ``nbytes``: ``latency + nbytes / bandwidth``.

    >>> exchange_seconds(1e6, bandwidth=1e9, latency=1e-3)
    0.002
    """
    _number("nbytes", nbytes, low=0.0, strict=False, fix="pass the payload size in bytes")
    _number("bandwidth", bandwidth, low=0.0, strict=True, fix="pass the measured all-reduce bytes per second")
    _number("latency", latency, low=0.0, strict=False, fix="pass the measured all-reduce latency in seconds")
    return latency + nbytes / bandwidth


def choose_partitions(
    model_bytes: float,
    bandwidth: float,
    latency: float,
    compute_seconds: float,
    max_partitions: int = 1024,
) -> int:
    """The fewest partitions ``p`` such that exchanging ``model_bytes / p`` fits in the compute.

    ``bandwidth`` (bytes/s) and ``latency`` (s) are the measured all-reduce figures;
    ``compute_seconds`` is the compute between syncs that the exchange overlaps. ``p = 1``
    when the whole model fits. When even the latency alone exceeds the compute, no ``p``
    fits and the answer is ``max_partitions`` (smallest messages).

    >>> choose_partitions(1e6, bandwidth=1e9, latency=1e-4, compute_seconds=0.01)
    1
    >>> choose_partitions(1e8, bandwidth=1e9, latency=0.0, compute_seconds=0.01)
    10
    >>> choose_partitions(1e8, bandwidth=1e9, latency=0.02, compute_seconds=0.01, max_partitions=64)
    64
    """
    _number("model_bytes", model_bytes, low=0.0, strict=True, fix="pass the flat model size in bytes")
    compute = _number("compute_seconds", compute_seconds, low=0.0, strict=False, fix="pass the measured compute time")
    cap = _int("max_partitions", max_partitions, 1)

    def fits(p: int) -> bool:
        return exchange_seconds(model_bytes / p, bandwidth, latency) <= compute

    if fits(1):
        return 1
    if compute <= latency:
        return cap
    p = min(cap, max(1, math.ceil(model_bytes / (bandwidth * (compute - latency)))))
    while p > 1 and fits(p - 1):  # guard against rounding in the closed form
        p -= 1
    while p < cap and not fits(p):
        p += 1
    return p


def partition_limit(rounds_per_epoch: int, exchanges_per_epoch: int = 4) -> int:
    """The most partitions that still exchange every slice ``exchanges_per_epoch`` times an epoch.

    With ``p`` partitions, slice ``i`` is sent in rounds ``i, i + p, i + 2p, ...``: each
    slice of the central model moves once every ``p`` sync rounds and is up to ``p - 1``
    rounds stale in between, while the replicas keep being pulled towards that stale value.
    If ``p`` exceeds the rounds of an epoch most slices are never exchanged within it (only the
    end-of-epoch flush moves them, all at once): measured on 2 hosts at 20 Mbit/s, ``p = 1024``
    with 15 rounds an epoch reached 0.16 accuracy where ``p = 1`` reached 0.85. Requiring
    ``exchanges_per_epoch`` exchanges of every slice within the rounds of one epoch gives
    ``p * exchanges_per_epoch <= rounds_per_epoch``, so
    ``p_max = max(1, rounds_per_epoch // exchanges_per_epoch)``: every slice is at most a
    ``1 / exchanges_per_epoch`` fraction of an epoch stale. ``choose_partitions(...,
    max_partitions=partition_limit(...))`` applies it; when the bandwidth rule wants more, the
    sync no longer fits in the compute, and learning wins over overlap.

    >>> partition_limit(15), partition_limit(62), partition_limit(3), partition_limit(62, exchanges_per_epoch=1)
    (3, 15, 1, 62)
    """
    rounds = _int("rounds_per_epoch", rounds_per_epoch, 1, "pass the sync rounds of one epoch (steps // sync_every)")
    per_epoch = _int("exchanges_per_epoch", exchanges_per_epoch, 1, "e.g. 4: every slice sent 4 times an epoch")
    return max(1, rounds // per_epoch)


def partition_bounds(numel: int, partitions: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of partition ``index`` of ``numel`` elements cut into near-equal parts.

    >>> [partition_bounds(10, 3, i) for i in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    _int("numel", numel, 1)
    _int("partitions", partitions, 1)
    if partitions > numel:
        raise ValueError(f"partitions={partitions} exceeds numel={numel}; use at most one partition per element")
    if not isinstance(index, int) or not 0 <= index < partitions:
        raise ValueError(f"index={index!r} must be in 0..{partitions - 1}")
    base, extra = divmod(numel, partitions)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


class SyncSlice(NamedTuple):
    """One round's partition: elements ``[start, stop)`` of the flat vector, and their values."""

    index: int
    start: int
    stop: int
    values: Tensor

    def dense(self, numel: int, values: Tensor | None = None) -> Tensor:
        """A full ``[numel]`` vector: ``values`` (default: the sent ones, e.g. pass the
        all-reduced ones instead) at ``[start, stop)``, zeros elsewhere."""
        v = self.values if values is None else values
        out = torch.zeros(numel, dtype=v.dtype, device=v.device)
        out[self.start : self.stop] = v
        return out


COMBINES = ("sum", "latest")


class PartitionedSync:
    """Rotating partial exchange of a flat correction vector (Ako-style).

    Each :meth:`exchange` takes the new correction ``[n]`` into what is pending, takes the
    pending values of partition ``round % p`` to send, and zeroes them; every element is
    sent once per ``p`` rounds. All workers must call it in lockstep (same round, same
    partition) for the all-reduce. ``combine`` says how a correction joins what is pending:

    - ``"sum"`` (Ako's accumulation, for *increments* such as gradients): pending += new, so
      nothing is lost: ``pending + Σ sent == Σ produced``.
    - ``"latest"`` (for *state differences* such as SMA's elastic corrections
      ``α (w_j − z)``, which restate the whole current gap every round): pending = new, so a
      slice carries its current correction. Summing them would apply the same gap up to
      ``p`` times at once: measured (3 workers x 2 replicas, digits, lr 0.2), ``"sum"`` with
      ``p = 3`` diverged (0.65 then 0.15 accuracy) where ``"latest"`` reached 0.88, 0.93, 0.95
      (``p = 1``: 0.87, 0.92). ``gpu.train`` uses ``"latest"`` for SMA.

    Wiring with SMA::

        part = ps.exchange(group.group_correction())
        group.apply_central(part.dense(n, allreduce(part.values)))

    >>> import torch
    >>> ps = PartitionedSync(numel=4, partitions=2, dtype=torch.float64)
    >>> ps.exchange(torch.ones(4))
    SyncSlice(index=0, start=0, stop=2, values=tensor([1., 1.], dtype=torch.float64))
    >>> ps.exchange(torch.ones(4)).values       # partition 1 has accumulated two rounds
    tensor([2., 2.], dtype=torch.float64)
    >>> ps.pending
    tensor([1., 1., 0., 0.], dtype=torch.float64)
    >>> ps.flush(), ps.pending
    (tensor([1., 1., 0., 0.], dtype=torch.float64), tensor([0., 0., 0., 0.], dtype=torch.float64))
    """

    def __init__(
        self,
        numel: int,
        partitions: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        combine: str = "sum",
    ) -> None:
        if combine not in COMBINES:
            raise ValueError(f"combine={combine!r}: use 'sum' (increments, e.g. gradients) or 'latest' (SMA corrections)")
        self.combine = combine
        self.numel = _int("numel", numel, 1)
        self.partitions = _int("partitions", partitions, 1, "use choose_partitions(...) to size it")
        if partitions > numel:
            raise ValueError(
                f"partitions={partitions} exceeds numel={numel}; use min(choose_partitions(...), numel)"
            )
        self.pending = torch.zeros(numel, device=device, dtype=dtype)
        self.round = 0

    def exchange(self, correction: Tensor) -> SyncSlice:
        """Accumulate ``correction`` ``[n]``; return this round's partition to send (and clear it)."""
        if not isinstance(correction, Tensor) or correction.shape != (self.numel,):
            shape = tuple(correction.shape) if isinstance(correction, Tensor) else type(correction).__name__
            raise ValueError(f"exchange: correction must be a flat tensor of shape ({self.numel},); got {shape}")
        new = correction.to(self.pending.device, self.pending.dtype)
        self.pending.copy_(new) if self.combine == "latest" else self.pending.add_(new)
        index = self.round % self.partitions
        start, stop = partition_bounds(self.numel, self.partitions, index)
        values = self.pending[start:stop].clone()
        self.pending[start:stop] = 0
        self.round += 1
        return SyncSlice(index, start, stop, values)

    def repartition(self, partitions: int) -> "PartitionedSync":
        """A sync cut into ``partitions`` that keeps what is pending here (nothing is lost).

        >>> ps = PartitionedSync(numel=4, partitions=4, dtype=torch.float64)
        >>> _ = ps.exchange(torch.ones(4))
        >>> q = ps.repartition(2); q.partitions, q.pending
        (2, tensor([0., 1., 1., 1.], dtype=torch.float64))
        """
        out = PartitionedSync(self.numel, partitions, device=self.pending.device, dtype=self.pending.dtype,
                              combine=self.combine)
        out.pending.copy_(self.pending)
        return out

    def flush(self) -> Tensor:
        """Everything still pending, as ``[n]`` (then cleared): send it at a learning-rate drop or the end."""
        out = self.pending.clone()
        self.pending.zero_()
        return out
