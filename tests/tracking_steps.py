"""Steps for tests/test_tracking.py, importable by the workers."""

from __future__ import annotations

import time


def digits() -> tuple:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X[:300], y[:300]


def logistic(data: tuple, C: float) -> dict:
    """A fitted scikit-learn model and its accuracy (on its own training rows: a test of logging)."""
    from sklearn.linear_model import LogisticRegression

    X, y = data
    model = LogisticRegression(C=C, max_iter=200).fit(X, y)
    return {"model": model, "accuracy": float(model.score(X, y))}


def numbers() -> list:
    return [1, 2, 3]


def wait(xs: list, seconds: float) -> dict:
    """Sleeps ``seconds``: a branch that is still running when the fast ones have finished."""
    time.sleep(seconds)
    return {"score": seconds, "n": len(xs)}
