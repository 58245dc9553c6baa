"""Estimators for tests/test_sklearn_search.py, importable by the workers."""

from __future__ import annotations

import os
import uuid

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin


class RecordingScaler(TransformerMixin, BaseEstimator):
    """Centres and scales by ``factor``; every ``fit`` leaves a file in ``log_dir`` (a side
    effect the test counts), named by the factor and the number of training rows."""

    def __init__(self, log_dir=None, factor=1.0):
        self.log_dir = log_dir
        self.factor = factor

    def fit(self, X, y=None):
        X = np.asarray(X, dtype=float)
        self.mean_ = X.mean(axis=0)
        self.n_features_in_ = X.shape[1]
        if self.log_dir:
            name = f"fit-{self.factor}-{X.shape[0]}-{int(X.sum() * 1000) % 10**9}-{uuid.uuid4().hex}"
            open(os.path.join(self.log_dir, name), "w").close()
        return self

    def transform(self, X):
        return (np.asarray(X, dtype=float) - self.mean_) * self.factor


def dict_scorer(estimator, X, y):
    """A callable scorer returning two metrics (multi-metric by callable)."""
    pred = estimator.predict(X)
    return {"acc": float(np.mean(pred == y)), "err": float(np.mean(pred != y))}


def pick_second(cv_results):
    """A ``refit`` callable: the candidate ranked second (or the first if there is one)."""
    order = np.argsort(cv_results["rank_test_score"], kind="stable")
    return int(order[1] if len(order) > 1 else order[0])


def picky_scorer(estimator, X, y):
    """Accuracy, except that it fails for ``C > 5`` (scikit-learn warns "Scoring failed")."""
    if getattr(estimator, "C", 0) > 5:
        raise ValueError("picky_scorer refuses C > 5")
    return float(np.mean(estimator.predict(X) == y))


class NeedsFrame(BaseEstimator):
    """A regressor that refuses anything but a pandas DataFrame (``transform_output='pandas'``)."""

    def __init__(self, shift=0.0):
        self.shift = shift

    def fit(self, X, y):
        import pandas as pd

        if not isinstance(X, pd.DataFrame):
            raise TypeError(f"NeedsFrame wants a DataFrame, got {type(X).__name__}")
        self.mean_ = float(np.mean(y)) + self.shift
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)

    def score(self, X, y):
        return -float(np.mean((self.predict(X) - y) ** 2))


class CountingCallback:
    """A scikit-learn fit callback (``sklearn.callback.FitCallback``) that counts its hooks and
    records the tasks and the training rows they saw."""

    def __init__(self):
        self.counts = {"setup": 0, "on_fit_task_begin": 0, "on_fit_task_end": 0, "teardown": 0}
        self.tasks = []
        self.rows = []

    def setup(self, estimator, context):
        self.counts["setup"] += 1

    def on_fit_task_begin(self, estimator, context, *, X=None, y=None, metadata=None):
        self.counts["on_fit_task_begin"] += 1
        self.tasks.append(("begin", context.task_name, context.task_id))
        weights = None if metadata is None else float(np.sum(metadata["sample_weight"]))
        self.rows.append((None if X is None else len(X), weights))

    def on_fit_task_end(self, estimator, context, *, X=None, y=None, metadata=None):
        self.counts["on_fit_task_end"] += 1

    def teardown(self, estimator, context):
        self.counts["teardown"] += 1
