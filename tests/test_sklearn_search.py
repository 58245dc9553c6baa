"""pipelines.sklearn: drop-in GridSearchCV / RandomizedSearchCV on a real LocalCluster.

Every search is compared with scikit-learn's own on the same data: same cv_results_ keys,
dtypes and values (timings aside), same best_*; fits of shared prefixes counted by their
side effects.  The cluster is conftest's shared ``client`` (2 worker processes).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sklearn = pytest.importorskip("sklearn")

from sklearn import model_selection as ms  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.exceptions import FitFailedWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression, Ridge  # noqa: E402
from sklearn.model_selection import KFold  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from pipelines.sklearn import GridSearchCV, RandomizedSearchCV, from_sklearn  # noqa: E402
from pipelines.sklearn.plan import TASKS_PER_THREAD, fold_groups, plan_levels  # noqa: E402
from pipelines.sklearn.results import fold_result  # noqa: E402
from tests.sklearn_steps import RecordingScaler, dict_scorer, pick_second  # noqa: E402

X, Y = load_iris(return_X_y=True)
X, Y = X[::2], Y[::2]  # 75 rows: small and quick


def pipe():
    return Pipeline([("scale", StandardScaler()), ("pca", PCA()), ("clf", LogisticRegression(max_iter=300))])


GRID = {"pca__n_components": [2, 3], "clf__C": [0.1, 10.0]}


def assert_same_results(ours, theirs):
    """Same keys, dtypes and values as scikit-learn's cv_results_ (timings: keys and dtypes)."""
    a, b = ours.cv_results_, theirs.cv_results_
    assert list(a) == list(b)
    for key in a:
        if key == "params":
            assert a[key] == b[key]
        elif "time" in key:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape and (a[key] >= 0).all()
        elif isinstance(b[key], np.ma.MaskedArray):
            assert isinstance(a[key], np.ma.MaskedArray) and a[key].dtype == b[key].dtype, key
            assert (a[key].mask == b[key].mask).all() and list(a[key]) == list(b[key]), key
        else:
            assert a[key].dtype == b[key].dtype, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for attr in ("best_index_", "best_params_", "best_score_", "n_splits_", "multimetric_"):
        assert (hasattr(ours, attr), getattr(ours, attr, None)) == (hasattr(theirs, attr), getattr(theirs, attr, None)), attr


CASES = {
    "pipeline, default scorer, train scores": (pipe, GRID, dict(cv=3, return_train_score=True)),
    "multi-metric list, refit by name": (pipe, GRID, dict(cv=3, scoring=["accuracy", "f1_macro"], refit="f1_macro")),
    "multi-metric dict, refit=False": (pipe, GRID, dict(cv=3, scoring={"a": "accuracy", "b": "balanced_accuracy"}, refit=False)),
    "callable scorer returning a dict": (pipe, GRID, dict(cv=3, scoring=dict_scorer, refit="acc")),
    "refit callable, KFold splitter": (pipe, GRID, dict(cv=KFold(3, shuffle=True, random_state=0), refit=pick_second)),
    "not a pipeline, list of grids, cv iterable": (
        SVC,
        [{"kernel": ["linear"], "C": [1, 10]}, {"kernel": ["rbf"], "gamma": [0.1, 1.0]}],
        dict(cv=[(np.arange(0, 75, 2), np.arange(1, 75, 2)), (np.arange(1, 75, 2), np.arange(0, 75, 2))]),
    ),
    "replacing a step (passthrough)": (pipe, {"pca": ["passthrough", PCA(2)], "clf__C": [1.0, 2.0]}, dict(cv=3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cv_results_equal_scikit_learns(client, case):
    make, grid, kwargs = CASES[case]
    ours = GridSearchCV(make(), grid, client=client, **kwargs).fit(X, Y)
    theirs = ms.GridSearchCV(make(), grid, **kwargs).fit(X, Y)
    assert_same_results(ours, theirs)
    if getattr(theirs, "best_estimator_", None) is not None:
        np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
        assert ours.score(X, Y) == theirs.score(X, Y)
    stats = ours.quiver_result_.stats
    assert stats["executed_tasks"] == stats["unique_tasks"]


def test_randomized_search_matches(client):
    dists = {"clf__C": [0.01, 0.1, 1.0, 10.0, 100.0], "pca__n_components": [2, 3]}
    ours = RandomizedSearchCV(pipe(), dists, n_iter=4, random_state=1, cv=3, client=client).fit(X, Y)
    theirs = ms.RandomizedSearchCV(pipe(), dists, n_iter=4, random_state=1, cv=3).fit(X, Y)
    assert_same_results(ours, theirs)


def test_regression_and_delegation(client):
    y = X[:, 0]
    ours = GridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3, client=client).fit(X[:, 1:], y)
    theirs = ms.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3).fit(X[:, 1:], y)
    assert_same_results(ours, theirs)
    np.testing.assert_array_equal(ours.predict(X[:, 1:]), theirs.predict(X[:, 1:]))
    assert ours.n_features_in_ == 3 and repr(ours.scorer_) == repr(theirs.scorer_)


@pytest.mark.slow
def test_each_prefix_fit_runs_once(client, tmp_path):
    """scale(factor) -> pca(n) -> clf(C): 2 x 2 x 3 = 12 candidates, 3 folds; the recording
    scaler is fitted once per (factor, fold) = 6 times, not 36 (and once more by the refit)."""
    log = tmp_path / "fits"
    log.mkdir()
    est = Pipeline([("scale", RecordingScaler(str(log))), ("pca", PCA()), ("clf", LogisticRegression(max_iter=300))])
    grid = {"scale__factor": [1.0, 2.0], "pca__n_components": [2, 3], "clf__C": [0.1, 1.0, 10.0]}
    ours = GridSearchCV(est, grid, cv=3, client=client, refit=False).fit(X, Y)
    fits = sorted(os.listdir(log))
    assert len(fits) == 6, fits
    assert len({f.rsplit("-", 1)[0] for f in fits}) == 6  # six different (factor, fold) fits
    stats = ours.quiver_result_.stats
    assert 4 * sum(client.nthreads().values()) <= 12  # so the 3 folds are one group (fold_groups)
    # data, the 3 folds split in one task, 2 scalers, 4 PCA, 12 final fits (each fitting and
    # scoring its 3 folds, then summarising them)
    assert stats["unique_tasks"] == 1 + 1 + 2 + 4 + 12
    assert stats["executed_tasks"] == stats["unique_tasks"]
    assert stats["naive_tasks"] > stats["unique_tasks"]
    theirs = ms.GridSearchCV(est.set_params(scale__log_dir=None), grid, cv=3, refit=False).fit(X, Y)
    np.testing.assert_array_equal(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])


@given(candidates=st.integers(1, 200), n_splits=st.integers(1, 12), threads=st.integers(1, 64))
def test_fold_groups_cut_the_folds_in_order_into_enough_tasks(candidates, n_splits, threads):
    groups = fold_groups(candidates, n_splits, threads)
    assert [i for g in groups for i in g] == list(range(n_splits))  # every fold once, in order
    assert all(groups) and max(map(len, groups)) - min(map(len, groups)) <= 1  # balanced
    if len(groups) < n_splits:  # folds share a task only when the threads stay busy anyway
        assert candidates * len(groups) >= TASKS_PER_THREAD * threads
    if len(groups) > 1:  # and are split no further than needed
        assert candidates * (len(groups) - 1) < TASKS_PER_THREAD * threads


def test_error_score_number_warns_like_scikit_learn(client):
    grid = {"clf__C": [1.0, -1.0]}  # C=-1 fails in fit
    with pytest.warns(FitFailedWarning, match="3 fits failed out of a total of 6") as record:
        ours = GridSearchCV(pipe(), grid, cv=3, client=client, error_score=0.0, return_train_score=True).fit(X, Y)
    assert "The 'C' parameter of LogisticRegression" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitFailedWarning)
        theirs = ms.GridSearchCV(pipe(), grid, cv=3, error_score=0.0, return_train_score=True).fit(X, Y)
    assert_same_results(ours, theirs)
    table = ours.quiver_result_.table
    assert (table["status"] == "ok").all() and table["split0_fit_error"].notna().sum() == 1


def test_error_score_raise_raises_the_fits_own_error(client):
    grid = {"clf__C": [1.0, -1.0]}
    with pytest.raises(ValueError, match="The 'C' parameter of LogisticRegression") as ours:
        GridSearchCV(pipe(), grid, cv=3, client=client, error_score="raise").fit(X, Y)
    with pytest.raises(ValueError) as theirs:
        ms.GridSearchCV(pipe(), grid, cv=3, error_score="raise").fit(X, Y)
    assert type(ours.value) is type(theirs.value)


def test_all_fits_failing_raises_like_scikit_learn(client):
    with pytest.raises(ValueError, match="All the 3 fits failed"):
        GridSearchCV(pipe(), {"clf__C": [-1.0]}, cv=3, client=client).fit(X, Y)


NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: a search that got as far as running would fail differently


@pytest.mark.parametrize(
    "grid, match",
    [
        ({"clf__not_a_param": [1]}, "Invalid parameter 'not_a_param'"),
        ({"clf__C": []}, "need to be a non-empty sequence"),
        ({"nostep__C": [1]}, "Invalid parameter 'nostep'"),
        ([], "No fits were performed"),
    ],
)
def test_bad_grid_refused_before_anything_runs(grid, match):
    with pytest.raises(ValueError, match=match):
        GridSearchCV(pipe(), grid, cv=3, client=NOWHERE).fit(X, Y)


def test_from_sklearn_is_a_node_with_step_explores(client):
    node = from_sklearn(pipe(), GRID, X, Y, cv=3)
    compiled = node.compile()
    assert compiled.explore_names == ["scale", "pca", "clf"] and len(compiled.branches) == 4
    per_pca = node.choose("mean_test_score", per="pca").run(client, quiet=True, progress=False)
    chosen = per_pca.table[per_pca.table["chosen"]]
    assert len(chosen) == 2 and set(chosen["pca.pca__n_components"]) == {2, 3}
    search = ms.GridSearchCV(pipe(), GRID, cv=3).fit(X, Y)
    for _, row in per_pca.table.iterrows():
        i = search.cv_results_["params"].index({"pca__n_components": row["pca.pca__n_components"], "clf__C": row["clf.clf__C"]})
        assert row["mean_test_score"] == search.cv_results_["mean_test_score"][i]
        assert row["split2_test_score"] == search.cv_results_["split2_test_score"][i]


CHECKS = {
    "check_get_params_invariance", "check_set_params", "check_estimators_pickle", "check_n_features_in",
    "check_estimators_unfitted", "check_complex_data",
}


def test_estimator_checks(client):
    """A selection of scikit-learn's own estimator checks (the full run, 74 checks for a
    classifier search, is in benchmarks/sklearn_search.py --checks: it takes a minute)."""
    from sklearn.utils.estimator_checks import estimator_checks_generator

    search = GridSearchCV(LogisticRegression(), {"C": [0.5, 1.0]}, cv=2, client=client.scheduler.address)
    ran = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for estimator, check in estimator_checks_generator(search, mark=None):
            name = getattr(check, "func", check).__name__
            if name in CHECKS:
                check(estimator)
                ran.append(name)
    assert set(ran) == CHECKS


# ---- pure decisions, literal inputs -------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_plan_splits_exactly_the_products(sizes, data):
    names = [f"s{i}" for i in range(len(sizes))]
    import itertools

    product = [
        {f"{n}__p": v for n, v in zip(names, point)} for point in itertools.product(*[range(k) for k in sizes])
    ]
    plan = plan_levels(names, product, token=lambda d: repr(sorted(d.items())))
    assert plan.split and [len(a) for a in plan.alternatives] == sizes
    if len(product) > 1:
        drop = data.draw(st.integers(0, len(product) - 1))
        partial = product[:drop] + product[drop + 1:]
        if all(len({c[f"{n}__p"] for c in partial}) == k for n, k in zip(names, sizes)):
            assert not plan_levels(names, partial, token=lambda d: repr(sorted(d.items()))).split


def test_fold_result_multimetric_callable_names():
    row = {"split1_test_acc": 1.0, "split1_test_err": 0.0, "split1_fit_time": 0.2, "split1_score_time": 0.1,
           "split1_n_test_samples": 5, "test_metrics": "acc|err"}
    out = fold_result(row, 1, multimetric_names=None, error_score=np.nan, train=False)
    assert out["test_scores"] == {"acc": 1.0, "err": 0.0} and out["fit_error"] is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_benchmark_quick_mode_runs(tmp_path):
    """benchmarks/sklearn_search.py --quick, Quiver's method only: it runs and records that the
    prefix was fitted exactly once per (params, fold) (speed goals stay in the benchmark)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "sklearn_search.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "sklearn_search.py"), "--quick", "--methods", "a",
                           "--output", str(out)], cwd=root, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["target"]["prefix_fits_equal_unique"] is True
    assert data["methods"]["(a) Quiver GridSearchCV"]["prefix_fits"] == [data["unique_prefix_fits"]]
