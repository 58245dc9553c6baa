"""An existing scikit-learn search, run by Quiver by changing one import line.

    python examples/sklearn_search.py

A ``Pipeline`` of a scaler, a costly transformer (an RBF KernelPCA) and several classifiers,
over a ``param_grid``, 5-fold CV, on the digits data set shipped with scikit-learn.  The
search runs twice: with scikit-learn's ``GridSearchCV(n_jobs=2)``, then with Quiver's (an
embedded LocalCluster, started inside ``fit``), and prints ``best_params_``, ``best_score_``,
both times and whether the two ``cv_results_`` agree.  Quiver fits each KernelPCA once per
fold and shares it with every classifier; scikit-learn fits it once per candidate and fold.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import KernelPCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV as SklearnGridSearchCV
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

# from sklearn.model_selection import GridSearchCV      # the search as it was
from pipelines.sklearn import GridSearchCV  # the one line that changes

X, y = load_digits(return_X_y=True)
pipe = Pipeline([
    ("scale", StandardScaler()),
    ("kpca", KernelPCA(kernel="rbf", gamma=0.01)),
    ("clf", LogisticRegression(max_iter=2000)),
])
param_grid = {
    "kpca__n_components": [20, 40],
    "clf": [
        LogisticRegression(C=0.1, max_iter=2000),
        LogisticRegression(C=1.0, max_iter=2000),
        SVC(C=1.0),
        SVC(C=10.0),
        KNeighborsClassifier(3),
        KNeighborsClassifier(7),
    ],
}


def main():
    start = time.perf_counter()
    theirs = SklearnGridSearchCV(pipe, param_grid, cv=5, n_jobs=2).fit(X, y)
    sklearn_s = time.perf_counter() - start

    start = time.perf_counter()
    ours = GridSearchCV(pipe, param_grid, cv=5, n_jobs=2).fit(X, y)  # n_jobs is accepted and ignored
    quiver_s = time.perf_counter() - start

    stats = ours.quiver_result_.stats
    print(f"best_params_: {ours.best_params_}")
    print(f"best_score_:  {ours.best_score_:.4f}")
    print(f"scikit-learn GridSearchCV(n_jobs=2): {sklearn_s:.1f} s; Quiver GridSearchCV: {quiver_s:.1f} s "
          f"(cluster start included); {stats['executed_tasks']} tasks run of {stats['naive_tasks']} without sharing")
    same = all(
        np.array_equal(ours.cv_results_[k], theirs.cv_results_[k])
        for k in theirs.cv_results_ if k.startswith(("split", "mean_test", "std_test", "rank"))
    )
    print(f"same cv_results_ scores and ranks as scikit-learn's: {same}; "
          f"same best_params_: {ours.best_params_ == theirs.best_params_}")
    print(ours.quiver_result_.table[["kpca", "kpca.kpca__n_components", "clf", "mean_test_score", "chosen"]].to_string())


if __name__ == "__main__":
    main()
