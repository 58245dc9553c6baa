"""DataFrame steps that run unchanged on pandas (CPU) and cudf (GPU): only methods both share.

>>> df = make_frame(rows=100, seed=0, lib="pandas")
>>> list(df.columns), len(clip(df, 1.0))
(['a', 'b', 'c', 'y'], 100)
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_frame", "clip", "center", "square", "score", "frame_module", "digits_frame", "clean_frame",
           "select_columns", "fit_logreg", "fit_tree", "held_out_score", "digits_exploration"]


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
    # "lib": which library's frame the step really received on the worker (pandas or cudf)
    return {"score": -float((resid * resid).mean()), "rows": int(len(df)), "lib": type(df).__module__.split(".")[0]}


# ---- the DataFrame exploration (scikit-learn's digits as a pandas DataFrame, tiled) ----

def digits_frame(copies: int = 1):
    """scikit-learn's digits as a DataFrame (64 pixel columns + ``target``), tiled ``copies`` times."""
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits(as_frame=True).frame
    return pd.concat([d] * copies, ignore_index=True) if copies > 1 else d


def clean_frame(df, how: str):
    X = df.drop(columns="target")
    if how == "standard":
        X = (X - X.mean()) / (X.std() + 1e-9)
    elif how == "minmax":
        X = (X - X.min()) / (X.max() - X.min() + 1e-9)
    elif how == "clip":
        X = X.clip(0, 8)
    out = X.astype("float64")
    out["target"] = df["target"].to_numpy()
    return out


def select_columns(df, k: int):
    from sklearn.feature_selection import SelectKBest, f_classif

    X, y = df.drop(columns="target"), df["target"]
    cols = X.columns[SelectKBest(f_classif, k=k).fit(X, y).get_support()]
    out = X[cols].copy()
    out["target"] = y.to_numpy()
    return out


def _split(df):
    n = len(df) * 3 // 4
    X, y = df.drop(columns="target").to_numpy(), df["target"].to_numpy()
    return X[:n], y[:n], X[n:], y[n:]


def fit_logreg(df, C: float):
    from sklearn.linear_model import LogisticRegression

    Xa, ya, Xb, yb = _split(df)
    m = LogisticRegression(C=C, max_iter=200).fit(Xa, ya)
    return {"accuracy": float(m.score(Xb, yb)), "model": m, "frame": df}


def fit_tree(df, max_depth):
    from sklearn.tree import DecisionTreeClassifier

    Xa, ya, Xb, yb = _split(df)
    m = DecisionTreeClassifier(max_depth=max_depth, random_state=0).fit(Xa, ya)
    return {"accuracy": float(m.score(Xb, yb)), "model": m, "frame": df}


def held_out_score(out):
    Xa, ya, Xb, yb = _split(out["frame"])
    return {"test_accuracy": float(out["model"].score(Xb, yb)), "lib": type(out["frame"]).__module__.split(".")[0]}


def digits_exploration(copies: int = 4):
    """3 cleanings x 3 feature selections x (logistic regression x 2 + tree x 2) = 36 branches,
    ``choose(k=3)`` then a test step on the kept three."""
    from pipelines import Pipeline, grid

    return (
        Pipeline("frames")
        .source(digits_frame, copies=copies)
        .explore("clean", grid(clean_frame, how=["standard", "minmax", "clip"]))
        .explore("select", grid(select_columns, k=[16, 32, 48]))
        .explore("model", grid(fit_logreg, C=[0.1, 1.0]), grid(fit_tree, max_depth=[None, 8]))
        .choose("accuracy", k=3)
        .then(held_out_score)
    )
