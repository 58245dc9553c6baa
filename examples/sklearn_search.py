"""An existing scikit-learn search, run by Quiver by changing one import line
==========================================================================

::

    python examples/sklearn_search.py            # 2 KernelPCA sizes x 6 classifiers x 5 folds
    python examples/sklearn_search.py --quick    # 1 size x 3 classifiers x 3 folds, 600 digits
    python examples/sklearn_search.py --report report/   # also result.plot()'s figures

A ``Pipeline`` of a scaler, a costly transformer (an RBF KernelPCA) and several classifiers,
over a ``param_grid``, 5-fold CV, on the digits data set shipped with scikit-learn.  The
search runs twice: with scikit-learn's ``GridSearchCV(n_jobs=2)``, then with Quiver's (an
embedded LocalCluster, started inside ``fit``), and prints ``best_params_``, ``best_score_``,
both times and whether the two ``cv_results_`` agree.  Quiver fits each KernelPCA once per
fold and shares it with every classifier; scikit-learn fits it once per candidate and fold.

The gallery runs it with ``--quick`` while the site builds (the full search takes about two
minutes on 2 cores, both searches included): the times printed there are of that small search
on a shared machine, not a benchmark (``benchmarks/sklearn_search.py`` is). The figure is
``result.plot()``'s for the Quiver search's ``quiver_result_``: each candidate's mean CV score.
"""

from __future__ import annotations

import argparse
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
# --quick: the same search, smaller (what the documentation gallery runs): 600 digits
quick_rows = 600
quick_grid = {"kpca__n_components": [20], "clf": [param_grid["clf"][i] for i in (1, 3, 4)]}


def main(argv=None):
    ap = argparse.ArgumentParser(description="GridSearchCV: scikit-learn's, then Quiver's (one import changed)")
    ap.add_argument("--quick", action="store_true", help="1 KernelPCA size x 3 classifiers x 3 folds, 600 digits")
    ap.add_argument("--report", metavar="DIR", help="also write result.plot()'s figures and report.html to DIR")
    args = ap.parse_args(argv)
    grid, cv, (X_, y_) = (quick_grid, 3, (X[:quick_rows], y[:quick_rows])) if args.quick else (param_grid, 5, (X, y))

    start = time.perf_counter()
    theirs = SklearnGridSearchCV(pipe, grid, cv=cv, n_jobs=2).fit(X_, y_)
    sklearn_s = time.perf_counter() - start

    start = time.perf_counter()
    ours = GridSearchCV(pipe, grid, cv=cv, n_jobs=2).fit(X_, y_)  # n_jobs is accepted and ignored
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
    if args.report:
        written = ours.quiver_result_.plot(args.report)
        print("report:", ", ".join(sorted(p.name for k, p in written.items() if k != "notes")))


# %%
# Run both searches on the same grid; print what Quiver chose, both times, whether the scores
# agree, and the branch table. ``--report DIR`` also writes ``result.plot()``'s figures.

if __name__ == "__main__":
    main()
