"""The digits example picks what an exhaustive scikit-learn search over the same grid picks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.example_module import example_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: the 63-branch demo


@pytest.fixture(scope="module")
def example():
    with example_module("digits_explore.py", "digits_explore_example") as module:
        yield module


def sklearn_scores(example):
    """Validation accuracy of every configuration: scikit-learn Pipelines over sklearn's ParameterGrid,
    fitted on the same training split and scored on the same validation split."""
    from sklearn.base import clone
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import ParameterGrid
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    from sklearn.svm import SVC

    d = example.load_split(seed=0)
    scalers = {"none": "passthrough", "standard": StandardScaler(), "minmax": MinMaxScaler()}
    common = {"scaler": list(scalers), "pca__n_components": [8, 16, 32]}
    grid = ParameterGrid(
        [
            {**common, "model": [LogisticRegression(max_iter=2000)], "model__C": [0.1, 1.0, 10.0]},
            {**common, "model": [SVC(gamma="scale")], "model__C": [1.0, 10.0]},
            {**common, "model": [KNeighborsClassifier()], "model__n_neighbors": [1, 5]},
        ]
    )
    scores = {}
    for params in grid:
        params = dict(params)
        scaler = params.pop("scaler")
        pipe = Pipeline(
            [("scaler", clone(scalers[scaler]) if scaler != "none" else "passthrough"),
             ("pca", PCA(random_state=0)), ("model", clone(params["model"]))]
        )
        pipe.set_params(**params)
        pipe.fit(d["X_train"], d["y_train"])
        score = pipe.score(d["X_val"], d["y_val"])
        model = type(params["model"]).__name__
        setting = params.get("model__C", params.get("model__n_neighbors"))
        scores[(scaler, params["pca__n_components"], model, float(setting))] = score
    return scores


def test_chosen_branch_matches_exhaustive_sklearn_search(client, example):
    result = example.output.run(client, progress=False, quiet=True)
    models = {"fit_logreg": "LogisticRegression", "fit_svc": "SVC", "fit_knn": "KNeighborsClassifier"}
    ours = {}
    for _, row in result.table.iterrows():
        setting = row["model.C"] if row["model"] in ("fit_logreg", "fit_svc") else row["model.n_neighbors"]
        ours[(row["scaler"], int(row["pca.n_components"]), models[row["model"]], float(setting))] = row["accuracy"]
    # Dask workers run BLAS single-threaded (distributed's nanny sets OMP_NUM_THREADS=1 and friends);
    # a different thread count changes float rounding enough to flip a borderline prediction.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        theirs = sklearn_scores(example)
    assert set(ours) == set(theirs) and len(ours) == 63
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-12), key
    best = max(theirs.values())
    chosen = result.chosen.iloc[0]
    assert chosen["accuracy"] == pytest.approx(best, abs=1e-12)
    setting = chosen["model.C"] if chosen["model"] != "fit_knn" else chosen["model.n_neighbors"]
    key = (chosen["scaler"], int(chosen["pca.n_components"]), models[chosen["model"]], float(setting))
    assert theirs[key] == pytest.approx(best, abs=1e-12)
    # ties go to the branch declared first
    tied = [i for i, (_, r) in enumerate(result.table.iterrows()) if r["accuracy"] == pytest.approx(best, abs=1e-12)]
    assert result.chosen.index[0] == tied[0]
    assert 0.9 < result.value["test_accuracy"] <= 1.0
