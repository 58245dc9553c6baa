"""The training loop one gang member runs: its replica group, its data shard, sync, tuning.

Every member builds the same seeded model, trains its own shard with ``replicas``
replicas (SMA) or ``replicas`` gradient batches (S-SGD), and calls ``ctx.allreduce`` to sum
over all members; alone, ``ctx`` is :class:`Solo` and the all-reduce is the identity.

>>> import torch
>>> from gpu.models import MLP, load_digits_tensors
>>> data = load_digits_tensors(seed=0)                                   # doctest: +SKIP
>>> cfg = TrainConfig(epochs=1, lr=0.05, batch_size=16, replicas=2)
>>> out = run_member(Solo(), data, lambda: MLP(64, 10), cfg)              # doctest: +SKIP
>>> sorted(out)                                                          # doctest: +SKIP
['delta_prev', 'history', 'replicas', 'tuning', 'z']
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .replicas import ReplicaGroup, SSGDGroup, replica_batches
from .sma import SMAConfig
from .tuning import PartitionedSync, ReplicaTuner, choose_partitions, partition_limit

__all__ = ["TrainConfig", "Solo", "run_member", "shard"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs besides data and model (validated on construction)."""

    epochs: int = 5
    lr: float = 0.05
    batch_size: int = 16
    replicas: int | str = "auto"
    algorithm: str = "sma"
    target_accuracy: float | None = None
    momentum: float = 0.9
    central_momentum: float = 0.9
    alpha: float = 0.1
    weight_decay: float = 1e-4
    sync_every: int = 1
    lr_drops: tuple[int, ...] = ()
    lr_drop_factor: float = 0.1
    seed: int = 0
    max_replicas: int = 8
    tune_threshold: float = 0.10
    tune_steps: int = 20
    partitions: int | str = 1
    eval_batch_size: int = 1024

    def __post_init__(self) -> None:
        def whole(name: str, low: int) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"train: {name}={v!r} must be a whole number >= {low}")

        for name, low in (("epochs", 1), ("batch_size", 1), ("sync_every", 1), ("max_replicas", 1), ("tune_steps", 1), ("eval_batch_size", 1)):
            whole(name, low)
        if self.replicas != "auto":
            whole("replicas", 1)
        if self.partitions != "auto":
            whole("partitions", 1)
        if self.algorithm not in ("sma", "ssgd"):
            raise ValueError(f"train: algorithm={self.algorithm!r}; use 'sma' or 'ssgd'")
        if self.algorithm == "ssgd" and self.replicas == "auto":
            raise ValueError("train: replicas='auto' tunes SMA replica groups; give S-SGD a number, e.g. replicas=4")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"train: lr={self.lr!r} must be a positive number")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"train: target_accuracy={self.target_accuracy!r} must be in (0, 1]")

    def sma(self, lr: float | None = None) -> SMAConfig:
        return SMAConfig(
            lr=self.lr if lr is None else lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            central_momentum=self.central_momentum,
            alpha=self.alpha,
            sync_every=self.sync_every,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Solo:
    """The context of a run without peers: rank 0 of 1, all-reduce is the identity."""

    rank = 0
    size = 1

    def allreduce(self, t: Tensor) -> Tensor:
        return t

    def checkpoint(self, state: dict) -> None:
        self.last = state


@dataclass
class _Timer:
    compute: float = 0.0
    sync: float = 0.0
    samples: int = 0
    rounds: int = 0  # sync rounds (all-reduces of a correction or gradient)


def _bytes_sent(ctx: Any) -> int:
    """Payload bytes this member's comm layer has sent so far (0 without peers)."""
    return int(getattr(ctx, "bytes_sent", 0) or 0)


def shard(x: Tensor, y: Tensor, rank: int, size: int) -> tuple[Tensor, Tensor]:
    """This member's share of the training set: every ``size``-th sample from ``rank``."""
    return x[rank::size], y[rank::size]


def _steps_per_epoch(n_train: int, size: int, replicas: int, batch: int) -> int:
    """Steps every member can take (the smallest shard decides, so all stay in lock step)."""
    return (n_train // size) // (replicas * batch)


def run_member(
    ctx: Any,
    data: Any,
    model: Callable[[], nn.Module],
    cfg: TrainConfig,
    resume: dict | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    on_tune: Callable[[list], None] | None = None,
) -> dict:
    """Train on this member; return ``z``, ``delta_prev``, the history and tuning records."""
    torch.manual_seed(cfg.seed)
    net = model()
    device = next(net.parameters()).device
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    xs, ys = shard(x_train, y_train, ctx.rank, ctx.size)
    start_epoch = 0
    lr = cfg.lr
    history: list[dict] = []
    if resume is not None:
        start_epoch, lr, history = resume["epoch"] + 1, resume["lr"], list(resume["history"])
    k = cfg.replicas if cfg.replicas != "auto" else (resume or {}).get("replicas", 1)
    if cfg.algorithm == "sma":
        group: Any = ReplicaGroup(net, replicas=k, config=cfg.sma(lr))
        if resume is not None:
            group.state.z.copy_(resume["z"].to(device))
            group.state.delta_prev.copy_(resume["delta_prev"].to(device))
            group.reset_to_central()
    else:
        group = SSGDGroup(net, replicas=k, config=cfg.sma(lr))
        if resume is not None:
            group.weights.copy_(resume["z"].to(device))
    world = ctx.size * k
    timer = _Timer()
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + ctx.rank)

    def timed_allreduce(t: Tensor) -> Tensor:
        t0 = time.perf_counter()
        out = ctx.allreduce(t)
        timer.sync += time.perf_counter() - t0
        return out

    def step(xb: Tensor, yb: Tensor) -> Tensor:
        t0 = time.perf_counter()
        sync_before = timer.sync
        if cfg.algorithm == "ssgd":
            losses = group.train_step(xb, yb, allreduce=timed_allreduce, world_replicas=world)
            timer.rounds += 1
            # the gradient all-reduce runs inside train_step: count it as sync, not compute
            timer.compute += time.perf_counter() - t0 - (timer.sync - sync_before)
        else:
            losses = group.local_step(xb, yb)
            t1 = time.perf_counter()
            timer.compute += t1 - t0
            if group.sync_due:
                c = group.group_correction()
                if sync is None:
                    group.apply_central(ctx.allreduce(c))
                else:
                    part = sync.exchange(c)
                    group.apply_central(part.dense(group.num_params, ctx.allreduce(part.values)))
                timer.sync += time.perf_counter() - t1
                timer.rounds += 1
        timer.samples += xb.shape[0] * xb.shape[1]
        return losses

    t_start = time.perf_counter()  # the clock starts at the first data touch: tuning counts
    sync: PartitionedSync | None = None
    tuning: list[tuple[int, float]] = []
    tuning_samples = 0
    if cfg.algorithm == "sma" and cfg.replicas == "auto" and resume is None:
        group, tuning, tuning_samples = _tune_replicas(ctx, group, xs, ys, cfg, step_fn=step, gen=gen)
        if on_tune is not None:  # the auto-tuner's (replicas, samples/s) curve, e.g. for the dashboard
            on_tune(list(tuning))
        k = group.replicas
        world = ctx.size * k
    steps = _steps_per_epoch(len(x_train), ctx.size, k, cfg.batch_size)
    if steps < 1:
        raise ValueError(
            f"train: {len(x_train)} training samples over {ctx.size} worker(s) cannot fill one step of "
            f"{k} replica(s) x batch_size={cfg.batch_size}; use fewer replicas or a smaller batch"
        )
    sync_tuning: dict = {}
    if cfg.algorithm == "sma":  # partial exchange (Ako): a fixed p, or "auto" bounded by the epoch's rounds
        sync, sync_tuning = _initial_sync(ctx, group, cfg, steps)
        if sync is not None and cfg.partitions == "auto":  # measure with the bound's p, then choose
            if timer.samples == 0:
                tuning_samples += _time_compute(group, xs, ys, cfg, timer, step, gen)
            sync, sync_tuning = _choose_sync(ctx, group, cfg, timer, sync, sync_tuning)
    for epoch in range(start_epoch, cfg.epochs):
        if epoch in cfg.lr_drops:
            if sync is not None:
                _flush(sync, group, ctx)
            if cfg.algorithm == "sma":
                group.drop_lr(cfg.lr_drop_factor)
            else:
                group.config = group.config.with_lr(group.config.lr * cfg.lr_drop_factor)
            lr = group.config.lr
        timer.compute = timer.sync = 0.0
        timer.samples = timer.rounds = 0
        sent0 = _bytes_sent(ctx)
        t0 = time.perf_counter()
        losses = []
        batches = replica_batches(xs, ys, k, cfg.batch_size, generator=gen)
        for _, (xb, yb) in zip(range(steps), batches):
            losses.append(step(xb, yb).mean().item())
        if sync is not None:
            _flush(sync, group, ctx)
        seconds = time.perf_counter() - t0
        ev = group.evaluate(x_test, y_test, batch_size=cfg.eval_batch_size)
        rec = {
            "epoch": epoch + 1,
            "train_loss": float(sum(losses) / max(len(losses), 1)),
            "test_loss": ev["loss"],
            "accuracy": ev["accuracy"],
            "samples_per_s": timer.samples * ctx.size / seconds if seconds > 0 else float("nan"),
            "compute_s": timer.compute,
            "sync_s": timer.sync,
            "sync_rounds": timer.rounds,
            # payload bytes this member sent in the epoch, end-of-epoch flush included (comm counters)
            "bytes_sent": _bytes_sent(ctx) - sent0,
            "replicas": k,
            "lr": lr,
            "spread": (max(group.spread()) if cfg.algorithm == "sma" else 0.0),
            # samples this member trained on in the epoch (the auto-tuner's steps count in the first)
            "samples": timer.samples + (tuning_samples if epoch == start_epoch else 0),
            "elapsed_s": time.perf_counter() - t_start,
        }
        history.append(rec)
        state = {
            "epoch": epoch,
            "lr": lr,
            "replicas": k,
            "z": (group.z if cfg.algorithm == "sma" else group.weights).detach().cpu().clone(),
            "delta_prev": (group.state.delta_prev.detach().cpu().clone() if cfg.algorithm == "sma" else None),
            "history": list(history),
        }
        if ctx.rank == 0:
            ctx.checkpoint(state)
        if on_epoch is not None:
            on_epoch(rec)
        if cfg.target_accuracy is not None and ev["accuracy"] >= cfg.target_accuracy:
            break
    final = group.z if cfg.algorithm == "sma" else group.weights
    return {
        "z": final.detach().cpu().clone(),
        "delta_prev": group.state.delta_prev.detach().cpu().clone() if cfg.algorithm == "sma" else None,
        "history": history,
        "replicas": k,
        "tuning": tuning,
        "tuning_samples": tuning_samples,
        "partitions": sync.partitions if sync is not None else 1,
        "sync_tuning": sync_tuning,
    }


def _flush(sync: PartitionedSync, group: ReplicaGroup, ctx: Any) -> None:
    """Send what the rotating partitions have not sent yet (one extra central update)."""
    group.apply_central(ctx.allreduce(sync.flush()))


def _tune_replicas(ctx, group, xs, ys, cfg: TrainConfig, step_fn, gen) -> tuple[ReplicaGroup, list, int]:
    """Crossbow's rule, live: one more replica while total samples/s rises by > threshold.

    The tuning steps are real SMA steps (they train the model); their samples are returned
    so the history counts them. Each count is timed over ``tune_steps`` steps, cycling over
    the shard as often as needed.
    """
    tuner = ReplicaTuner(threshold=cfg.tune_threshold, max_replicas=cfg.max_replicas)
    trained = 0

    def batches(k: int):
        while True:
            yield from replica_batches(xs, ys, k, cfg.batch_size, generator=gen)

    while (k := tuner.propose()) is not None:
        if len(xs) < k * cfg.batch_size:
            break
        group.resize(k)
        stream = batches(k)
        xb, yb = next(stream)
        step_fn(xb, yb)  # warm-up step: allocation and vmap tracing are not throughput
        trained += xb.shape[0] * xb.shape[1]
        done, t0 = 0, time.perf_counter()
        for _, (xb, yb) in zip(range(cfg.tune_steps), stream):
            step_fn(xb, yb)
            done += xb.shape[0] * xb.shape[1]
        rate = done / max(time.perf_counter() - t0, 1e-9)
        trained += done
        total = ctx.allreduce(torch.tensor([rate], dtype=torch.float64)).item()
        tuner.observe(k, total)
    group.resize(tuner.best)
    return group, tuner.curve, trained


# SMA's corrections restate the current gap to z each round: a slice sends its latest one (see PartitionedSync)
_COMBINE = "latest"


def _initial_sync(ctx, group, cfg: TrainConfig, steps: int) -> tuple[PartitionedSync | None, dict]:
    """The partial exchange to start with: ``partitions`` as given, or for ``"auto"`` (with peers)
    the most partitions that still send every slice ``exchanges_per_epoch`` times an epoch
    (:func:`gpu.tuning.partition_limit`), used while the compute and bandwidth are measured."""
    n = group.num_params
    if cfg.partitions != "auto":
        p = min(cfg.partitions, n)
        return (PartitionedSync(n, p, device=group.device, dtype=group.z.dtype, combine=_COMBINE) if p > 1 else None), {}
    limit = min(partition_limit(max(steps // cfg.sync_every, 1)), n)
    if ctx.size == 1 or getattr(ctx, "bandwidth", None) is None or limit == 1:
        return None, {"limit": limit, "partitions": 1}
    return PartitionedSync(n, limit, device=group.device, dtype=group.z.dtype, combine=_COMBINE), {"limit": limit}


def _time_compute(group, xs, ys, cfg: TrainConfig, timer: _Timer, step_fn, gen) -> int:
    """Time the compute between syncs over a few real steps (they train; their samples are returned)."""
    def batches():
        while True:
            yield from replica_batches(xs, ys, group.replicas, cfg.batch_size, generator=gen)

    stream, trained = batches(), 0
    for i in range(1 + 4 * cfg.sync_every):
        if i == 1:  # the first step warms up (allocation, vmap tracing): not timed
            timer.compute, timer.samples = 0.0, 0
        xb, yb = next(stream)
        step_fn(xb, yb)
        trained += xb.shape[0] * xb.shape[1]
    return trained


def _choose_sync(ctx, group, cfg: TrainConfig, timer: _Timer, sync: PartitionedSync, record: dict):
    """Ako's rule within the bound: the fewest partitions whose exchange fits in the compute between
    syncs, the bandwidth measured on the gang's own collective (the worker-to-worker path)."""
    nbytes = group.num_params * group.z.element_size()
    bandwidth, latency = ctx.bandwidth(nbytes)
    compute = max(timer.compute / max(timer.samples / (group.replicas * cfg.batch_size), 1), 1e-6)
    # every member must choose the same p: decide on the members' mean compute, not this one's
    compute = ctx.allreduce(torch.tensor([compute], dtype=torch.float64)).item() / ctx.size
    p = choose_partitions(nbytes, bandwidth, latency, compute * cfg.sync_every, max_partitions=record["limit"])
    record = {**record, "bandwidth": bandwidth, "latency": latency,
              "compute_per_round_s": compute * cfg.sync_every, "partitions": p}
    if p == 1:
        _flush(sync, group, ctx)
        return None, record
    return sync.repartition(p), record
