"""Training algorithms, one object each, behind one interface that :func:`gpu.engine.run_member` drives.

An algorithm owns its replica group, its synchronisation and its timing; the engine owns the
loop (data, epochs, learning-rate drops, evaluation, checkpoints, tuning) and never asks which
algorithm it runs. Every algorithm is built with everything its :meth:`~Algorithm.step` reads
(the all-reduce, the partitioned sync), so no step can run before its sync exists.

* :class:`SMA`: Crossbow's synchronous model averaging (the equations of ``docs/architecture.md`` §5, in
  :mod:`gpu.sma`): each replica steps on its own batch; every τ steps the group's corrections
  are summed over all workers (optionally a rotating ``1/p`` slice, :class:`gpu.tuning.PartitionedSync`)
  and move the central model ``z``.
* :class:`SSGD`: synchronous SGD, the baseline: gradients averaged over all replicas on all
  workers every step.

>>> import torch
>>> from gpu.models import MLP
>>> from gpu.engine import TrainConfig
>>> _ = torch.manual_seed(0)
>>> algo = ALGORITHMS["sma"](MLP(4, 3, hidden=(8,)), TrainConfig(lr=0.1), replicas=2, allreduce=lambda t: t)
>>> algo.step(torch.randn(2, 5, 4), torch.randint(0, 3, (2, 5))).shape, algo.timer.samples
(torch.Size([2]), 10)
>>> sorted(algo.checkpoint())
['delta_prev', 'partitions', 'z']
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from torch import Tensor, nn

from .replicas import ReplicaGroup, SSGDGroup
from .tuning import PartitionedSync

__all__ = ["Timer", "Algorithm", "SMA", "SSGD", "ALGORITHMS"]


@dataclass
class Timer:
    """Seconds of compute and of synchronisation, and samples trained, since the last :meth:`reset`."""

    compute: float = 0.0
    sync: float = 0.0
    samples: int = 0
    steps: int = 0
    rounds: int = 0  # sync rounds: all-reduces of a correction (SMA) or of a gradient (S-SGD)

    def reset(self) -> None:
        self.compute = self.sync = 0.0
        self.samples = self.steps = self.rounds = 0


class Algorithm:
    """What the engine needs from a training algorithm.

    Built from the seeded model, the run's config, the replicas per worker and ``allreduce``
    (sums a flat tensor over all workers; the identity alone). ``partitions`` > 1 splits each
    sync into a rotating slice (only algorithms with ``partitionable`` accept it).
    """

    name: ClassVar[str]
    tunable: ClassVar[bool] = False  # whether replicas="auto" may tune the replicas per worker
    partitionable: ClassVar[bool] = False  # whether the sync may be split (partitions > 1)

    def __init__(self, model: nn.Module, cfg: Any, replicas: int, allreduce: Callable[[Tensor], Tensor],
                 *, world: int = 1, partitions: int = 1, lr: float | None = None) -> None:
        self.cfg = cfg
        self.world = world
        self.timer = Timer()
        self._allreduce = allreduce
        self.group = self._group(model, replicas, cfg.sma(lr))
        if partitions != 1 and not self.partitionable:
            raise ValueError(f"train: algorithm={self.name!r} cannot split its sync; use partitions=1")
        self.partitions = min(partitions, self.num_params)

    # --- to implement -------------------------------------------------------------------
    def _group(self, model: nn.Module, replicas: int, config) -> Any:
        raise NotImplementedError

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        """One training step on stacked batches ``x [k, b, ...]``, its sync included; losses ``[k]``."""
        raise NotImplementedError

    @property
    def weights(self) -> Tensor:
        """The trained model's flat weights ``[n]`` (SMA: ``z``)."""
        raise NotImplementedError

    def checkpoint(self) -> dict:
        """What a restart needs besides the epoch, lr and history (tensors on the CPU)."""
        return {"z": self.weights.detach().cpu().clone(), "delta_prev": None, "partitions": self.partitions}

    def restore(self, state: dict) -> None:
        self.weights.copy_(state["z"].to(self.group.device))

    # --- shared -------------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        return self.group.replicas

    @property
    def num_params(self) -> int:
        return self.group.num_params

    @property
    def lr(self) -> float:
        return self.group.config.lr

    @property
    def nbytes(self) -> int:
        """Bytes of one full exchange (the flat model)."""
        return self.num_params * self.weights.element_size()

    def timed_allreduce(self, t: Tensor) -> Tensor:
        t0 = time.perf_counter()
        out = self._allreduce(t)
        self.timer.sync += time.perf_counter() - t0
        return out

    def drop_lr(self, factor: float) -> None:
        """Multiply the learning rate by ``factor`` (at an epoch in ``lr_drops``)."""
        self.group.config = self.group.config.with_lr(self.group.config.lr * factor)

    def end_epoch(self) -> None:
        """Send whatever the sync still holds back (nothing, unless partitioned)."""

    def spread(self) -> float:
        """Largest distance of a replica from the trained model (0 when there is one model)."""
        return 0.0

    def evaluate(self, x: Tensor, y: Tensor, batch_size: int) -> dict[str, float]:
        return self.group.evaluate(x, y, batch_size=batch_size)


class SMA(Algorithm):
    """Synchronous model averaging (Crossbow); the trained model is the central ``z``."""

    name = "sma"
    tunable = True
    partitionable = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sync: PartitionedSync | None = None
        if self.partitions > 1:
            g = self.group
            # SMA's corrections restate the current gap to z each round: a slice sends its latest one
            self.sync = PartitionedSync(g.num_params, self.partitions, device=g.device, dtype=g.z.dtype,
                                        combine="latest")

    def _group(self, model, replicas, config):
        return ReplicaGroup(model, replicas=replicas, config=config)

    @property
    def weights(self) -> Tensor:
        return self.group.z

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        g, timer = self.group, self.timer
        t0 = time.perf_counter()
        losses = g.local_step(x, y)
        t1 = time.perf_counter()
        timer.compute += t1 - t0
        if g.sync_due:
            c = g.group_correction()
            if self.sync is None:
                g.apply_central(self._allreduce(c))
            else:
                part = self.sync.exchange(c)
                g.apply_central(part.dense(g.num_params, self._allreduce(part.values)))
            timer.sync += time.perf_counter() - t1
            timer.rounds += 1
        timer.samples += x.shape[0] * x.shape[1]
        timer.steps += 1
        return losses

    def end_epoch(self) -> None:
        if self.sync is not None:  # one extra central update with what the slices held back
            t0 = time.perf_counter()
            self.group.apply_central(self._allreduce(self.sync.flush()))
            self.timer.sync += time.perf_counter() - t0

    def drop_lr(self, factor: float) -> None:
        self.end_epoch()
        self.group.drop_lr(factor)  # and every w_j <- z

    def resize(self, replicas: int) -> None:
        self.group.resize(replicas)

    def spread(self) -> float:
        return max(self.group.spread())

    def checkpoint(self) -> dict:
        return {**super().checkpoint(), "delta_prev": self.group.state.delta_prev.detach().cpu().clone()}

    def restore(self, state: dict) -> None:
        g = self.group
        g.state.z.copy_(state["z"].to(g.device))
        g.state.delta_prev.copy_(state["delta_prev"].to(g.device))
        g.reset_to_central()


class SSGD(Algorithm):
    """Synchronous SGD: every step, gradients averaged over all replicas on all workers."""

    name = "ssgd"

    def _group(self, model, replicas, config):
        return SSGDGroup(model, replicas=replicas, config=config)

    @property
    def weights(self) -> Tensor:
        return self.group.weights

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        t0, sync0 = time.perf_counter(), self.timer.sync
        losses = self.group.train_step(x, y, allreduce=self.timed_allreduce,
                                       world_replicas=self.world * self.replicas)
        # the gradient all-reduce runs inside train_step: it counts as sync, not compute
        self.timer.compute += time.perf_counter() - t0 - (self.timer.sync - sync0)
        self.timer.rounds += 1
        self.timer.samples += x.shape[0] * x.shape[1]
        self.timer.steps += 1
        return losses


ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (SMA, SSGD)}
