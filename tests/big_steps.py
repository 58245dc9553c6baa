"""Steps with large intermediates for the memory-planner tests and benchmark (NumPy only).

The shape is the one that hurts Dask's defaults: one shared source, a cleaning
explore, a feature explore and a model explore whose outputs (each as large as the
data) are all held until a choose decides, after which only the kept branch goes on.

>>> x = make_data(rows=1000, cols=4, seed=0)
>>> x.shape, clean(x, "clip").dtype
((1000, 4), dtype('float64'))
>>> sorted(evaluate(fit(features(x, "square"), alpha=1.0)))
['residual', 'score']
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_data", "clean", "features", "fit", "evaluate", "refit", "exploration", "payload", "shift", "square_x"]


def make_data(rows: int, cols: int, seed: int) -> np.ndarray:
    """Seeded data: ``rows x cols`` float64 (8 bytes each)."""
    return np.random.default_rng(seed).standard_normal((rows, cols))


def clean(x: np.ndarray, method: str) -> np.ndarray:
    if method == "clip":
        return np.clip(x, -2.0, 2.0)
    if method == "center":
        return x - x.mean(axis=0)
    if method == "scale":
        return x / x.std(axis=0)
    if method == "rank":
        return np.argsort(np.argsort(x, axis=0), axis=0).astype(np.float64) / len(x)
    raise ValueError(f"unknown cleaning method {method!r}")


def features(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "square":
        return x * x
    if kind == "abs":
        return np.abs(x)
    if kind == "tanh":
        return np.tanh(x)
    if kind == "identity":
        return x.copy()
    raise ValueError(f"unknown feature kind {kind!r}")


def fit(x: np.ndarray, alpha: float) -> dict:
    """A ridge fit of the last column on the others; returns the residuals (as big as a column
    block of ``x``) and the fit's score."""
    a, y = x[:, :-1], x[:, -1]
    gram = a.T @ a + alpha * np.eye(a.shape[1])
    w = np.linalg.solve(gram, a.T @ y)
    residual = np.repeat((y - a @ w)[:, None], x.shape[1], axis=1)  # as big as the input
    return {"residual": residual, "score": float(-np.mean(residual[:, 0] ** 2))}


def evaluate(model: dict) -> dict:
    return {"score": model["score"], "residual": float(np.abs(model["residual"]).mean())}


def refit(model: dict) -> dict:
    """The step after the choose: summarise the kept model."""
    r = model["residual"]
    return {"score": model["score"], "residual_std": float(r[:, 0].std()), "rows": int(r.shape[0])}


def exploration(rows: int, cols: int = 8, seed: int = 0, cleans=("clip", "center", "scale", "rank"),
                kinds=("square", "abs", "tanh", "identity"), alphas=(0.1, 1.0, 10.0), k: int = 1, **choose):
    """The pipeline: ``len(cleans) * len(kinds) * len(alphas)`` branches, each intermediate
    ``rows * cols * 8`` bytes; a choose keeps the best ``k`` fits (or as ``choose`` says:
    ``threshold=``, ``per=``), then refits them."""
    from pipelines import Pipeline, grid

    return (
        Pipeline("memory")
        .source(make_data, rows=rows, cols=cols, seed=seed)
        .explore("clean", grid(clean, method=list(cleans)))
        .explore("features", grid(features, kind=list(kinds)))
        .explore("model", grid(fit, alpha=list(alphas)))
        .choose("score", mode="max", k=k, **choose)
        .then(refit)
    )


def payload(megabytes: int) -> dict:
    """A cheap, large value: ``{"x": 0.0, "a": <megabytes of float64>}``."""
    return {"x": 0.0, "a": np.ones(megabytes * 125_000)}


def shift(v: dict, n: float) -> dict:
    return {"x": float(n), "a": v["a"] + n}


def square_x(v: dict) -> dict:
    return {"x": v["x"] ** 2}
