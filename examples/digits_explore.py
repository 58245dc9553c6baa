"""Explore preprocessing x features x models on scikit-learn's digits, keep the best
==================================================================================

::

    python examples/digits_explore.py                  # embedded LocalCluster
    python examples/digits_explore.py --report report/ # also the figures (report/report.html)
    quiver run examples/digits_explore.py              # the same through the CLI

3 scalers x 3 PCA sizes x (3 logistic-regression + 2 SVC + 2 k-NN) = 63 branches of 5 steps
(split, scaler, PCA, model, test), so 315 naive tasks. Every branch shares the data split, each
scaler is fitted once and each PCA once per scaler: the compiled graph has 139 unique tasks
(1 + 3 + 9 + 63, plus a test step for each of the 63 branches the choose might keep), and 77 of
them run, since the test step runs only on the chosen branch.

The gallery runs it at full size while the site builds (about 15 s on 2 cores); the figure
is ``result.plot()``'s: each branch's validation accuracy, grouped by each explore's
alternatives, the chosen branch highlighted.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.svm import SVC

from pipelines import Pipeline, grid

def load_split(seed: int) -> dict:
    """Digits split 60/20/20 (stratified, seeded) into train, validation and test sets."""
    X, y = load_digits(return_X_y=True)
    X_trval, X_test, y_trval, y_test = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    X_train, X_val, y_train, y_val = train_test_split(
        X_trval, y_trval, test_size=0.25, random_state=seed, stratify=y_trval
    )
    return {"X_train": X_train, "y_train": y_train, "X_val": X_val, "y_val": y_val, "X_test": X_test, "y_test": y_test}


def _transform(data: dict, transformer) -> dict:
    out = dict(data)
    out["X_train"] = transformer.fit_transform(data["X_train"])  # as sklearn's Pipeline.fit does
    for split in ("val", "test"):
        out[f"X_{split}"] = transformer.transform(data[f"X_{split}"])
    return out


def identity(data: dict) -> dict:
    return data


def standardize(data: dict) -> dict:
    return _transform(data, StandardScaler())


def minmax(data: dict) -> dict:
    return _transform(data, MinMaxScaler())


def pca(data: dict, n_components: int) -> dict:
    return _transform(data, PCA(n_components=n_components, random_state=0))


def _fit(data: dict, model) -> dict:
    model.fit(data["X_train"], data["y_train"])
    accuracy = float(np.mean(model.predict(data["X_val"]) == data["y_val"]))
    return {"accuracy": accuracy, "model": model, "data": data}


def fit_logreg(data: dict, C: float) -> dict:
    return _fit(data, LogisticRegression(C=C, max_iter=2000))


def fit_svc(data: dict, C: float) -> dict:
    return _fit(data, SVC(C=C, gamma="scale"))


def fit_knn(data: dict, n_neighbors: int) -> dict:
    return _fit(data, KNeighborsClassifier(n_neighbors=n_neighbors))


def test_accuracy(fitted: dict) -> dict:
    data, model = fitted["data"], fitted["model"]
    acc = float(np.mean(model.predict(data["X_test"]) == data["y_test"]))
    return {"test_accuracy": acc, "model": model}


p = Pipeline("digits")
data = p.source(load_split, seed=0)
scaled = data.explore("scaler", none=identity, standard=standardize, minmax=minmax)
feats = scaled.explore("pca", grid(pca, n_components=[8, 16, 32]))
scored = feats.explore(
    "model",
    grid(fit_logreg, C=[0.1, 1.0, 10.0]),
    grid(fit_svc, C=[1.0, 10.0]),
    grid(fit_knn, n_neighbors=[1, 5]),
)
best = scored.choose("accuracy", mode="max")
output = best.then(test_accuracy)


# %%
# Run it: the ten best branches by validation accuracy, the chosen one (scored once on the test
# set) and how many tasks ran of the naive count. ``--report DIR`` also writes ``result.plot()``'s
# figures (below on the gallery page).

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="63 branches over scikit-learn's digits; the best kept")
    ap.add_argument("--report", metavar="DIR", help="also write result.plot()'s figures and report.html to DIR")
    args = ap.parse_args()
    result = output.run()
    shown = result.table.drop(columns=["traceback", "error", "failed_step"])
    print(shown.sort_values("accuracy", ascending=False).head(10).to_string())
    row = result.chosen.iloc[0]
    s = result.stats
    print(
        f"\nchosen: scaler={row['scaler']} pca={row['pca.n_components']} model={row['model']} "
        f"validation accuracy={row['accuracy']:.4f} test accuracy={result.value['test_accuracy']:.4f}"
    )
    print(
        f"{s['branches']} branches: {s['executed_tasks']} tasks executed, {s['unique_tasks']} unique, "
        f"{s['naive_tasks']} naive; {s['wall_seconds']:.1f}s"
    )
    if args.report:
        written = result.plot(args.report)
        print("report:", ", ".join(sorted(p.name for k, p in written.items() if k != "notes")))
