"""DataFrame steps that run unchanged on pandas (CPU) and cudf (GPU): only methods both share.

>>> df = make_frame(rows=100, seed=0, lib="pandas")
>>> list(df.columns), len(clip(df, 1.0))
(['a', 'b', 'c', 'y'], 100)
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_frame", "clip", "center", "square", "score", "frame_module"]


def frame_module(lib: str):
    if lib == "cudf":
        import cudf

        return cudf
    import pandas

    return pandas


def make_frame(rows: int, seed: int, lib: str = "pandas"):
    rng = np.random.default_rng(seed)
    data = {c: rng.standard_normal(rows) for c in "abc"}
    data["y"] = data["a"] * 2.0 - data["b"] + 0.1 * rng.standard_normal(rows)
    return frame_module(lib).DataFrame(data)


def clip(df, limit: float):
    return df.clip(-limit, limit)


def center(df):
    return df - df.mean()


def square(df):
    out = df * df
    out["y"] = df["y"]
    return out


def score(df, weight: float):
    """A one-feature least-squares fit quality of ``y`` on ``a`` (higher is better)."""
    a, y = df["a"] * weight, df["y"]
    cov = float(((a - a.mean()) * (y - y.mean())).mean())
    var = float(((a - a.mean()) ** 2).mean())
    resid = y - y.mean() - (cov / var) * (a - a.mean())
    return {"score": -float((resid * resid).mean()), "rows": int(len(df))}
