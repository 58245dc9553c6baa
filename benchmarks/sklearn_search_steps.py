"""The costly shared prefix of benchmarks/sklearn_search.py, in a module so that joblib's
cache (which pickles it by reference) and every worker can import it."""

from __future__ import annotations

import os
import uuid

from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.decomposition import PCA


class CostlyPCA(TransformerMixin, BaseEstimator):
    """PCA with a full SVD (the costly prefix); each fit leaves a file in ``log_dir``."""

    def __init__(self, n_components=10, log_dir=None):
        self.n_components = n_components
        self.log_dir = log_dir

    def fit(self, X, y=None):
        self.pca_ = PCA(self.n_components, svd_solver="full").fit(X)
        if self.log_dir:
            open(os.path.join(self.log_dir, uuid.uuid4().hex), "w").close()
        return self

    def transform(self, X):
        return self.pca_.transform(X)
