"""Workload (b) of ``benchmarks/adaptive_search.py``: a torch training loop on ``load_digits``.

A module of its own, importing torch at the top: Quiver's workers import it before a search
starts (``graph.cluster.warmup``), and the Optuna baseline imports it before its clock, so
neither method's wall counts torch's import.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits


def digits(seed=0):
    """scikit-learn's ``load_digits``, scaled to [0, 1], shuffled and split 80/20."""
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    X, y = (X[order] / 16.0).astype("float32"), y[order].astype("int64")
    cut = int(0.8 * len(y))
    return {"Xtr": X[:cut], "ytr": y[:cut], "Xte": X[cut:], "yte": y[cut:]}


def train_mlp(d, lr, weight_decay, epochs=30, batch=64, seed=0):
    """One trial's training: yields ``{"accuracy", "loss"}`` after each epoch (a generator step;
    ``benchmarks/adaptive_search.py``'s Optuna objective runs the same loop)."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)  # not torch.manual_seed: Optuna's n_jobs=2 trains in 2 threads of one process
    Xtr, ytr = torch.from_numpy(d["Xtr"]), torch.from_numpy(d["ytr"])
    Xte, yte = torch.from_numpy(d["Xte"]), torch.from_numpy(d["yte"])
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with torch.no_grad():  # the same initial weights for the same seed, whatever runs beside it
        for layer in (model[0], model[2]):
            bound = layer.in_features ** -0.5
            layer.weight.uniform_(-bound, bound, generator=gen)
            layer.bias.uniform_(-bound, bound, generator=gen)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(ytr), generator=gen).split(batch):
            optimizer.zero_grad()
            loss = loss_fn(model(Xtr[idx]), ytr[idx])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = (model(Xte).argmax(1) == yte).float().mean().item()
        yield {"accuracy": acc if acc == acc else 0.0, "loss": float(loss.item())}
