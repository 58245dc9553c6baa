"""pipelines.sklearn behaves as scikit-learn's own searches do (issue 25).

Each test runs the drop-in on conftest's shared ``client`` (a real LocalCluster, 2 worker
processes) and scikit-learn's class on the same data, and compares what the caller sees:
``cv_results_``, exceptions (type and message), warnings, pickling, configuration.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from dask.base import tokenize  # noqa: E402
from sklearn import model_selection as ms  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from pipelines.sklearn import GridSearchCV  # noqa: E402

RNG = np.random.RandomState(0)
XR = RNG.rand(20, 3)
YR = RNG.rand(20)
YC = (YR > 0.5).astype(int)


def same_cv_results(ours, theirs):
    """Same keys and values (timings aside); parameters compared by token (they may be arrays)."""
    a, b = ours.cv_results_, theirs.cv_results_
    assert list(a) == list(b)
    for key in a:
        if "time" in key:
            continue
        if key == "params" or key.startswith("param_"):
            assert tokenize(list(a[key])) == tokenize(list(b[key])), key
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def raised(fit):
    with pytest.raises(Exception) as info:
        fit()
    return type(info.value), str(info.value)


# ---- point 4: array-valued parameters ------------------------------------------------------
def test_array_valued_parameters(client):
    grid = {"alpha": [np.array([1.0, 2.0]), np.array([3.0, 4.0])]}
    Y2 = np.c_[YR, YR[::-1]]
    ours = GridSearchCV(Ridge(), grid, cv=2, client=client).fit(XR, Y2)
    theirs = ms.GridSearchCV(Ridge(), grid, cv=2).fit(XR, Y2)
    same_cv_results(ours, theirs)
    assert tokenize(ours.best_params_) == tokenize(theirs.best_params_)


# ---- point 5: the exceptions are scikit-learn's ---------------------------------------------
@pytest.mark.parametrize("error_score", [np.nan, "raise"])
def test_every_candidate_failing_before_fit_raises_sklearns_error(client, error_score):
    """SVC(kernel='precomputed') on a non-square X fails in the fold split of every candidate."""
    ours = raised(lambda: GridSearchCV(SVC(kernel="precomputed"), {"C": [1, 2]}, cv=2, client=client,
                                       error_score=error_score).fit(XR, YC))
    theirs = raised(lambda: ms.GridSearchCV(SVC(kernel="precomputed"), {"C": [1, 2]}, cv=2,
                                            error_score=error_score).fit(XR, YC))
    assert ours == theirs == (ValueError, "X should be a square kernel matrix")


@pytest.mark.parametrize("cv, grid", [([], {"alpha": [1.0, 2.0]}), (2, [])])
def test_no_fits_raises_sklearns_error(client, cv, grid):
    ours = raised(lambda: GridSearchCV(Ridge(), grid, cv=cv, client=client).fit(XR, YR))
    theirs = raised(lambda: ms.GridSearchCV(Ridge(), grid, cv=cv).fit(XR, YR))
    assert ours == theirs


# ---- point 8: pickling, clone, get_params / set_params -------------------------------------
def client_values(client):
    return {"Client": client, "address": client.scheduler.address, "None": None}


@pytest.mark.parametrize("kind", ["Client", "address", "None"])
def test_unfitted_search_clones_and_round_trips_params(client, kind):
    import pickle

    from sklearn.base import clone

    value = client_values(client)[kind]
    search = GridSearchCV(Ridge(), {"alpha": [1.0, 2.0]}, cv=2, client=value, memory_budget="1 GiB")
    copied = clone(search)
    assert copied.client is value and copied.memory_budget == "1 GiB" and copied is not search
    assert search.client is value  # clone leaves the original as it was
    params = search.get_params()
    again = GridSearchCV(Ridge(), {}).set_params(**params)
    assert again.get_params()["client"] is value and again.get_params()["estimator__alpha"] == 1.0
    loaded = pickle.loads(pickle.dumps(search))
    expected = client.scheduler.address if kind != "None" else None
    assert loaded.client == expected  # a Client pickles as its scheduler address


def test_fitted_search_with_a_client_pickles(client):
    import pickle

    search = GridSearchCV(Ridge(), {"alpha": [1.0, 2.0]}, cv=2, client=client).fit(XR, YR)
    loaded = pickle.loads(pickle.dumps(search))
    np.testing.assert_array_equal(loaded.predict(XR), search.predict(XR))
    assert loaded.best_params_ == search.best_params_ and loaded.client == client.scheduler.address
    assert search.client is client
    refit = loaded.fit(XR, YR)  # the address reaches the same scheduler
    np.testing.assert_array_equal(refit.cv_results_["mean_test_score"], search.cv_results_["mean_test_score"])


# ---- point 3: warnings met on the workers are raised in the caller -------------------------
def warned(fit):
    """(category, message) of every warning a fit raised in this process, from scikit-learn's
    or the tests' code (not the cluster's own chatter), each occurrence, in order."""
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit()
    return [(w.category.__name__, str(w.message)) for w in record
            if f"site-packages{os.sep}sklearn{os.sep}" in w.filename or f"{os.sep}tests{os.sep}" in w.filename]


def test_convergence_warnings_reach_the_caller_per_candidate_and_fold(client):
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    X, y = XR, YC

    def est():
        return Pipeline([("pca", PCA(2)), ("clf", LogisticRegression(max_iter=1))])

    grid = {"clf__C": [0.5, 1.0]}
    ours = warned(lambda: GridSearchCV(est(), grid, cv=3, client=client, refit=False).fit(X, y))
    theirs = warned(lambda: ms.GridSearchCV(est(), grid, cv=3, refit=False).fit(X, y))
    assert len(theirs) == 6 and {c for c, _ in theirs} == {"ConvergenceWarning"}
    assert ours == theirs


def test_scorer_warnings_and_scoring_failed_reach_the_caller(client):
    from sklearn.dummy import DummyClassifier
    from sklearn.svm import LinearSVC

    from tests.sklearn_steps import picky_scorer

    grid = {"strategy": ["most_frequent", "stratified"], "random_state": [0]}
    ours = warned(lambda: GridSearchCV(DummyClassifier(), grid, cv=2, scoring="precision", client=client).fit(XR, YC))
    theirs = warned(lambda: ms.GridSearchCV(DummyClassifier(), grid, cv=2, scoring="precision").fit(XR, YC))
    assert any(c == "UndefinedMetricWarning" for c, _ in theirs)
    assert ours == theirs
    grid = {"C": [1.0, 10.0]}
    for error_score in (0.0, np.nan):  # nan: "Scoring failed", then the non-finite mean warning
        search = GridSearchCV(LinearSVC(), grid, cv=2, scoring=picky_scorer, error_score=error_score, client=client)
        ours = warned(lambda: search.fit(XR, YC))
        theirs = warned(lambda: ms.GridSearchCV(LinearSVC(), grid, cv=2, scoring=picky_scorer,
                                                error_score=error_score).fit(XR, YC))
        assert sum(m.startswith("Scoring failed") for _, m in theirs) == 2
        assert ours == theirs
    table = search.quiver_result_.table
    assert table["warnings"].str.contains("UserWarning on folds 0,1: Scoring failed").sum() == 1
    assert [(w["candidate"], w["fold"]) for w in table.attrs["warnings"]] == [(1, 0), (1, 1)]
    assert not any(c.startswith("_warnings") for c in table.columns)


# ---- point 2: scikit-learn's configuration holds in the workers' fits ----------------------
def routed_search(cls, client=None, request=True):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, make_scorer

    weighted = make_scorer(accuracy_score)
    if request:
        weighted = weighted.set_score_request(sample_weight=True)
    est = LogisticRegression(max_iter=300).set_fit_request(sample_weight=False)
    kwargs = {} if client is None else {"client": client}
    plain = make_scorer(accuracy_score).set_score_request(sample_weight=False)
    return cls(est, {"C": [0.01, 1.0]}, cv=3, scoring={"w": weighted, "acc": plain}, refit="w", **kwargs)


def test_metadata_routing_holds_in_the_workers(client):
    """The weighted scorer asks for ``sample_weight``: with routing on in the caller, only it
    gets the weights, in the workers too (without the config there, both scorers got them)."""
    weights = np.linspace(0.1, 5.0, len(YC))
    with sklearn.config_context(enable_metadata_routing=True):
        ours = routed_search(GridSearchCV, client).fit(XR, YC, sample_weight=weights)
        theirs = routed_search(ms.GridSearchCV).fit(XR, YC, sample_weight=weights)
    same_cv_results(ours, theirs)
    assert not np.array_equal(theirs.cv_results_["mean_test_w"], theirs.cv_results_["mean_test_acc"])


def test_unrequested_metadata_raises_sklearns_error(client):
    weights = np.ones(len(YC))
    with sklearn.config_context(enable_metadata_routing=True):
        ours = raised(lambda: routed_search(GridSearchCV, client, request=False).fit(XR, YC, sample_weight=weights))
        theirs = raised(lambda: routed_search(ms.GridSearchCV, request=False).fit(XR, YC, sample_weight=weights))
    assert ours == theirs and ours[0].__name__ == "UnsetMetadataPassedError"


def test_transform_output_config_holds_in_the_workers(client):
    """``transform_output='pandas'``: a step that needs DataFrame input fails without it."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.sklearn_steps import NeedsFrame

    est = Pipeline([("scale", StandardScaler()), ("clf", NeedsFrame())])
    with sklearn.config_context(transform_output="pandas"):
        ours = GridSearchCV(est, {"clf__shift": [0.0, 1.0]}, cv=2, client=client, error_score="raise").fit(XR, YR)
        theirs = ms.GridSearchCV(est, {"clf__shift": [0.0, 1.0]}, cv=2, error_score="raise").fit(XR, YR)
    same_cv_results(ours, theirs)


# ---- point 6: verbose prints scikit-learn's lines in the caller ----------------------------
def cv_lines(text):
    return sorted(line.rsplit(" total time=", 1)[0] for line in text.splitlines() if line.startswith(("[CV", "Fitting")))


@pytest.mark.parametrize("verbose, kind", [(2, "Client"), (3, "address"), (10, "Client")])
def test_verbose_prints_sklearns_lines(client, capsys, verbose, kind):
    value = client_values(client)[kind]
    grid = {"alpha": [0.5, 2.0]}
    GridSearchCV(Ridge(), grid, cv=3, verbose=verbose, client=value, return_train_score=True).fit(XR, YR)
    ours = capsys.readouterr()
    ms.GridSearchCV(Ridge(), grid, cv=3, verbose=verbose, return_train_score=True).fit(XR, YR)
    theirs = capsys.readouterr()
    assert len(cv_lines(theirs.out)) == (13 if verbose > 9 else 7)  # START lines at verbose > 9
    assert cv_lines(ours.out) == cv_lines(theirs.out)
    if kind == "address":
        assert "dashboard" in ours.err  # the link is still shown


# ---- point 1: scikit-learn's fit callbacks ---------------------------------------------------
def test_callbacks_called_as_sklearn_calls_them(client):
    from tests.sklearn_steps import CountingCallback

    def run(cls, **kwargs):
        cb = CountingCallback()
        search = cls(Ridge(), {"alpha": [0.5, 1.0, 2.0]}, cv=3, **kwargs).set_callbacks(cb)
        search.fit(XR, YR, sample_weight=np.ones(len(YR)))
        return cb

    ours, theirs = run(GridSearchCV, client=client), run(ms.GridSearchCV)
    assert theirs.counts == {"setup": 1, "on_fit_task_begin": 1 + 1 + 9 + 1, "on_fit_task_end": 12, "teardown": 1}
    assert ours.counts == theirs.counts
    assert ours.tasks == theirs.tasks  # the same task tree: names, ids, in the same order
    assert ours.rows == theirs.rows  # the hooks saw the same training data sizes and weights


# ---- point 7: successive halving ----------------------------------------------------------
HALVING_ATTRS = ("best_params_", "best_index_", "best_score_", "n_candidates_", "n_resources_", "n_iterations_",
                 "n_possible_iterations_", "n_required_iterations_", "n_remaining_candidates_", "min_resources_",
                 "max_resources_")


def same_halving(ours, theirs):
    same_cv_results(ours, theirs)
    for attr in HALVING_ATTRS:
        assert tokenize(getattr(ours, attr)) == tokenize(getattr(theirs, attr)), attr
    np.testing.assert_array_equal(ours.predict(XH), theirs.predict(XH))


XH, YH = None, None


def halving_data():
    global XH, YH
    from sklearn.datasets import make_classification

    XH, YH = make_classification(n_samples=120, n_features=6, random_state=0)
    return XH, YH


@pytest.mark.parametrize("kwargs", [
    dict(factor=2, random_state=0),  # resource n_samples, min_resources exhaust
    dict(factor=3, min_resources=20, max_resources=100, aggressive_elimination=True, random_state=1),
])
def test_halving_grid_matches_sklearn(client, kwargs):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import HalvingGridSearchCV as SkHalving

    from pipelines.sklearn import HalvingGridSearchCV

    X, y = halving_data()
    grid = {"C": [0.001, 0.01, 0.1, 1.0, 10.0, 100.0], "fit_intercept": [True, False]}
    ours = HalvingGridSearchCV(LogisticRegression(), grid, cv=3, client=client, **kwargs).fit(X, y)
    theirs = SkHalving(LogisticRegression(), grid, cv=3, **kwargs).fit(X, y)
    same_halving(ours, theirs)
    assert len(ours.quiver_results_) == ours.n_iterations_ >= 2
    assert list(ours.cv_results_["iter"]) == list(theirs.cv_results_["iter"])


def test_halving_random_with_an_estimator_resource(client):
    from scipy.stats import loguniform
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import HalvingRandomSearchCV as SkHalving

    from pipelines.sklearn import HalvingRandomSearchCV

    X, y = halving_data()
    dists = {"max_depth": [2, 3, 4, None], "min_samples_leaf": [1, 2, 4], "max_features": loguniform(0.3, 1.0)}
    kwargs = dict(n_candidates=8, resource="n_estimators", max_resources=12, min_resources=3, factor=2, cv=2,
                  random_state=0)
    est = RandomForestClassifier(random_state=0)
    ours = HalvingRandomSearchCV(est, dists, client=client, **kwargs).fit(X, y)
    theirs = SkHalving(est, dists, **kwargs).fit(X, y)
    same_halving(ours, theirs)
    assert ours.n_resources_ == [3, 6, 12]
