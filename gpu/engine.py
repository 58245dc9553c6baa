"""The training loop one gang member runs: its data shard, epochs, tuning, checkpoints.

Every member builds the same seeded model, trains its own shard with ``replicas``
replicas (SMA) or ``replicas`` gradient batches (S-SGD), and calls ``ctx.allreduce`` to sum
over all members; alone, ``ctx`` is :class:`Solo` and the all-reduce is the identity. What
differs between algorithms lives in their objects (:mod:`gpu.algorithms`); this loop drives
any of them the same way.

``replicas="auto"`` tunes on a scratch copy of the model (its own batches and random state),
then trains the seeded model from the start with the chosen count: a run that tuned to ``k``
and a run given ``replicas=k`` train the same model, step for step.

>>> import torch
>>> from gpu.models import MLP, load_digits_tensors
>>> data = load_digits_tensors(seed=0)                                   # doctest: +SKIP
>>> cfg = TrainConfig(epochs=1, lr=0.05, batch_size=16, replicas=2)
>>> out = run_member(Solo(), data, lambda: MLP(64, 10), cfg)              # doctest: +SKIP
>>> sorted(out)[:4]                                                      # doctest: +SKIP
['delta_prev', 'history', 'partitions', 'replicas']
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .algorithms import ALGORITHMS, Algorithm
from .replicas import replica_batches
from .sma import SMAConfig
from .tuning import ReplicaTuner, choose_partitions, partition_limit

__all__ = ["TrainConfig", "Solo", "run_member", "iter_member", "tune_member", "shard"]


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
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"train: algorithm={self.algorithm!r}; use one of {sorted(ALGORITHMS)}")
        kind = ALGORITHMS[self.algorithm]
        if self.replicas == "auto" and not kind.tunable:
            raise ValueError("train: replicas='auto' tunes SMA replica groups; give S-SGD a number, e.g. replicas=4")
        if self.partitions != 1 and not kind.partitionable:
            raise ValueError(f"train: partitions={self.partitions!r} splits SMA's sync; "
                             f"algorithm={self.algorithm!r} exchanges whole gradients: use partitions=1")
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


def _bytes_sent(ctx: Any) -> int:
    """Payload bytes this member's comm layer has sent so far (0 without peers)."""
    return int(getattr(ctx, "bytes_sent", 0) or 0)


def shard(x: Tensor, y: Tensor, rank: int, size: int) -> tuple[Tensor, Tensor]:
    """This member's share of the training set: every ``size``-th sample from ``rank``."""
    return x[rank::size], y[rank::size]


def _steps_per_epoch(n_train: int, size: int, replicas: int, batch: int) -> int:
    """Steps every member can take (the smallest shard decides, so all stay in lock step)."""
    return (n_train // size) // (replicas * batch)


def _tuning_seed(cfg: TrainConfig, rank: int) -> int:
    """The seed of the batches measurement steps draw (apart from training's, so tuning leaves
    training's batch order as it would be without it)."""
    return cfg.seed * 1000 + rank + 500_000


def _prepare(ctx: Any, data: Any, model: Callable[[], nn.Module], cfg: TrainConfig, lr: float):
    """The seeded model, the data on its device, this member's shard, and ``build(k, partitions)``
    making an algorithm object from the model."""
    torch.manual_seed(cfg.seed)
    net = model()
    device = next(net.parameters()).device
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    xs, ys = shard(x_train, y_train, ctx.rank, ctx.size)
    kind = ALGORITHMS[cfg.algorithm]

    def build(k: int, partitions: int = 1) -> Algorithm:
        return kind(net, cfg, k, ctx.allreduce, world=ctx.size, partitions=partitions, lr=lr)

    shortest = len(x_train) // ctx.size  # every member decides from the same numbers
    return build, (x_train, y_train, x_test, y_test), (xs, ys), shortest


def tune_member(ctx: Any, data: Any, model: Callable[[], nn.Module], cfg: TrainConfig,
                on_tune: Callable[[list], None] | None = None) -> dict:
    """Only the replica tuning of :func:`run_member` (a gang of its own, so that concurrent
    runs can wait for one tuning and reuse its choice). Returns what ``run_member(tuned=...)`` takes."""
    t0 = time.perf_counter()
    build, _, (xs, ys), shortest = _prepare(ctx, data, model, cfg, cfg.lr)
    k, curve, samples, step_compute = _tune_replicas(ctx, build, xs, ys, shortest, cfg)
    if on_tune is not None:
        on_tune(list(curve))
    return {"replicas": k, "tuning": curve, "tuning_samples": samples, "step_compute": step_compute,
            "tuning_s": time.perf_counter() - t0, "source": "tuned"}


def run_member(
    ctx: Any,
    data: Any,
    model: Callable[[], nn.Module],
    cfg: TrainConfig,
    resume: dict | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    on_tune: Callable[[list], None] | None = None,
    tuned: dict | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict:
    """Train on this member; return ``z``, ``delta_prev``, the history, tuning records and timings.

    ``tuned``: with ``replicas="auto"``, a choice made already (:func:`tune_member`'s result,
    possibly remembered from an earlier run) instead of tuning here. ``on_epoch(record)`` is
    called after every epoch; ``stop()``, asked after every epoch, ends the training there
    when true (every member of a gang must answer alike: see ``gpu.training``).
    """
    epochs = iter_member(ctx, data, model, cfg, resume, on_tune, tuned)
    try:
        rec = next(epochs)
        while True:
            if on_epoch is not None:
                on_epoch(rec)
            rec = epochs.send(stop is not None and bool(stop()))
    except StopIteration as end:
        return end.value


def iter_member(
    ctx: Any,
    data: Any,
    model: Callable[[], nn.Module],
    cfg: TrainConfig,
    resume: dict | None = None,
    on_tune: Callable[[list], None] | None = None,
    tuned: dict | None = None,
):
    """:func:`run_member` as a generator: yields each epoch's record (after its checkpoint)
    and returns the result dict. ``send(True)`` instead of ``next`` ends the training at
    that epoch boundary (the generator returns the result so far)."""
    t_start = time.perf_counter()  # the clock starts at the first data touch: tuning counts
    start_epoch, lr, history = 0, cfg.lr, []
    if resume is not None:
        start_epoch, lr, history = resume["epoch"] + 1, resume["lr"], list(resume["history"])
    build, (x_train, y_train, x_test, y_test), (xs, ys), shortest = _prepare(ctx, data, model, cfg, lr)

    # replicas per worker: given, from the checkpoint, or tuned on a scratch copy of the model
    tuning: list[tuple[int, float]] = []
    tuning_samples, step_compute = 0, None
    t0 = time.perf_counter()
    if cfg.replicas != "auto":
        k, source = cfg.replicas, "given"
    elif resume is not None:
        k, source = resume["replicas"], "checkpoint"
    elif tuned is not None:
        k, tuning, source = tuned["replicas"], [tuple(p) for p in tuned["tuning"]], tuned.get("source", "tuned")
        tuning_samples, step_compute = tuned.get("tuning_samples", 0), tuned.get("step_compute")
        if on_tune is not None:
            on_tune(list(tuning))
    else:
        k, tuning, tuning_samples, step_compute = _tune_replicas(ctx, build, xs, ys, shortest, cfg)
        source = "tuned"
        if on_tune is not None:  # the auto-tuner's (replicas, samples/s) curve, e.g. for the dashboard
            on_tune(list(tuning))
    tuning_s = time.perf_counter() - t0
    steps = _steps_per_epoch(len(x_train), ctx.size, k, cfg.batch_size)
    if steps < 1:
        raise ValueError(
            f"train: {len(x_train)} training samples over {ctx.size} worker(s) cannot fill one step of "
            f"{k} replica(s) x batch_size={cfg.batch_size}; use fewer replicas or a smaller batch"
        )
    t0 = time.perf_counter()
    sync_tuning: dict = {}
    if resume is not None and resume.get("partitions") is not None:
        partitions = resume["partitions"]
    elif cfg.partitions != "auto":
        partitions = cfg.partitions
    else:  # Ako's rule, bounded by the epoch's sync rounds (gpu.tuning.partition_limit)
        partitions, sync_tuning = _auto_partitions(ctx, build, k, xs, ys, shortest, cfg, step_compute, steps)
    partitions_s = time.perf_counter() - t0
    algo = build(k, partitions)
    if resume is not None:
        algo.restore(resume)

    gen = torch.Generator().manual_seed(cfg.seed * 1000 + ctx.rank)
    for epoch in range(start_epoch, cfg.epochs):
        if epoch in cfg.lr_drops:
            algo.drop_lr(cfg.lr_drop_factor)
            lr = algo.lr
        algo.timer.reset()
        sent0 = _bytes_sent(ctx)
        t0 = time.perf_counter()
        losses = []
        for _, (xb, yb) in zip(range(steps), replica_batches(xs, ys, k, cfg.batch_size, generator=gen)):
            losses.append(algo.step(xb, yb).mean().item())
        algo.end_epoch()
        seconds = time.perf_counter() - t0
        ev = algo.evaluate(x_test, y_test, batch_size=cfg.eval_batch_size)
        eval_s = time.perf_counter() - t0 - seconds
        timer = algo.timer
        sent = _bytes_sent(ctx) - sent0  # the comm layer's count, the end-of-epoch flush included
        rec = {
            "epoch": epoch + 1,
            "train_loss": float(sum(losses) / max(len(losses), 1)),
            "test_loss": ev["loss"],
            "accuracy": ev["accuracy"],
            "samples_per_s": timer.samples * ctx.size / seconds if seconds > 0 else float("nan"),
            "compute_s": timer.compute,
            "sync_s": timer.sync,
            "sync_rounds": timer.rounds,  # all-reduces of a correction (SMA) or gradient (S-SGD)
            "bytes_sent": sent,  # payload bytes this member sent in the epoch
            "train_s": seconds,  # the epoch's steps, sync included
            "eval_s": eval_s,  # evaluating z on the test split
            "replicas": k,
            "lr": lr,
            "spread": algo.spread(),
            "samples": timer.samples,  # samples this member trained on in the epoch
            "elapsed_s": time.perf_counter() - t_start,
        }
        history.append(rec)
        if ctx.rank == 0:
            ctx.checkpoint({"epoch": epoch, "lr": lr, "replicas": k, **algo.checkpoint(), "history": list(history)})
        if (yield rec):
            break
        if cfg.target_accuracy is not None and ev["accuracy"] >= cfg.target_accuracy:
            break
    state = algo.checkpoint()
    return {
        "z": state["z"],
        "delta_prev": state["delta_prev"],
        "history": history,
        "replicas": k,
        "replicas_source": source,
        "tuning": tuning,
        "tuning_samples": tuning_samples,
        "partitions": algo.partitions,
        "sync_tuning": sync_tuning,
        "timings": {"tuning_s": tuning_s, "partitions_s": partitions_s},
    }


def _measure(algo: Algorithm, xs: Tensor, ys: Tensor, cfg: TrainConfig, gen: torch.Generator) -> tuple[int, float, float]:
    """One warm-up step (allocation and vmap tracing are not throughput), then ``tune_steps``
    timed steps cycling over the shard; returns samples trained, samples/s and compute s/step."""
    def batches():
        while True:
            yield from replica_batches(xs, ys, algo.replicas, cfg.batch_size, generator=gen)

    stream = batches()
    xb, yb = next(stream)
    algo.step(xb, yb)
    trained = xb.shape[0] * xb.shape[1]
    algo.timer.reset()
    t0 = time.perf_counter()
    for _, (xb, yb) in zip(range(cfg.tune_steps), stream):
        algo.step(xb, yb)
    elapsed = max(time.perf_counter() - t0, 1e-9)
    done = algo.timer.samples
    return trained + done, done / elapsed, algo.timer.compute / max(algo.timer.steps, 1)


def _tune_replicas(ctx, build, xs, ys, shortest: int, cfg: TrainConfig) -> tuple[int, list, int, float | None]:
    """Crossbow's rule, live: one more replica while total samples/s rises by > threshold.

    Measured on a scratch copy of the model with its own batches and random state, so the
    run that follows trains exactly as a run given the chosen count would. Every member
    measures, the rates are summed over members (an all-reduce) and every member decides
    alike. Returns the chosen count, the ``(replicas, samples/s)`` curve, the samples the
    measurement steps used, and the mean compute seconds per step at the chosen count.
    """
    tuner = ReplicaTuner(threshold=cfg.tune_threshold, max_replicas=cfg.max_replicas)
    gen = torch.Generator().manual_seed(_tuning_seed(cfg, ctx.rank))
    trained, compute = 0, {}
    with _own_rng(xs):
        # the sync training will use (a partition count given), else the whole exchange
        scratch = build(1, cfg.partitions if cfg.partitions != "auto" else 1)
        while (k := tuner.propose()) is not None:
            if shortest < k * cfg.batch_size:
                break
            scratch.resize(k)
            done, rate, per_step = _measure(scratch, xs, ys, cfg, gen)
            trained += done
            total, summed = ctx.allreduce(torch.tensor([rate, per_step], dtype=torch.float64)).tolist()
            tuner.observe(k, total)
            compute[k] = summed / ctx.size
    return tuner.best, tuner.curve, trained, compute.get(tuner.best)


def _auto_partitions(ctx, build, k: int, xs, ys, shortest: int, cfg: TrainConfig, step_compute: float | None,
                     steps: int) -> tuple[int, dict]:
    """Ako's rule within Ako's bound: split the exchange when sending the whole correction costs
    more than the compute between two syncs, into no more partitions than still send every slice
    ``exchanges_per_epoch`` times an epoch (:func:`gpu.tuning.partition_limit` of the epoch's
    sync rounds). The compute is measured (on a scratch copy, unless the replica tuner just
    measured it at ``k``), averaged over members so that all choose alike; the bandwidth is
    measured on the gang's own collective (the worker-to-worker path). Returns ``p`` and the
    record of the choice (``sync_tuning``)."""
    if not ALGORITHMS[cfg.algorithm].partitionable:
        return 1, {}
    probe = build(1)
    limit = min(partition_limit(max(steps // cfg.sync_every, 1)), probe.num_params)
    measure = getattr(ctx, "bandwidth", None)
    if ctx.size == 1 or measure is None or limit == 1:
        return 1, {"limit": limit, "partitions": 1}
    if step_compute is None:
        gen = torch.Generator().manual_seed(_tuning_seed(cfg, ctx.rank))
        with _own_rng(xs):
            _, _, per_step = _measure(build(k), xs, ys, cfg, gen)
        # every member must choose the same p: decide on the members' mean compute, not this one's
        step_compute = ctx.allreduce(torch.tensor([per_step], dtype=torch.float64)).item() / ctx.size
    bandwidth, latency = measure(probe.nbytes)
    per_round = max(step_compute, 1e-9) * cfg.sync_every
    p = min(choose_partitions(probe.nbytes, bandwidth, latency, per_round, max_partitions=limit), probe.num_params)
    return p, {"limit": limit, "bandwidth": bandwidth, "latency": latency,
               "compute_per_round_s": per_round, "partitions": p}


def _own_rng(x: Tensor):
    """Measurement steps draw from a forked random state: training's stays as if they never ran."""
    return torch.random.fork_rng(devices=[x.device] if x.is_cuda else [])
