"""A tiny SMA training exploration for ``quiver run`` tests: scikit-learn digits, a small MLP,
two learning rates, two epochs of batches of 64 (a few seconds on 2 CPU workers)."""

from __future__ import annotations

import functools

import gpu
from pipelines import Pipeline, grid

mlp = functools.partial(gpu.MLP, 64, 10, hidden=(32,))

output = (
    Pipeline("tiny-sma")
    .source(gpu.load_digits_tensors, seed=0)
    .explore("train", grid(gpu.train, model=[mlp], lr=[0.2, 0.3], epochs=[2], replicas=[2], batch_size=[64], timeout=[30.0]))
    .choose("accuracy")
)
