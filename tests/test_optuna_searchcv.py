"""pipelines.sklearn.OptunaSearchCV against optuna_integration's (issue 47, item 4).

The drop-in runs on conftest's shared ``client`` (2 worker processes, 1 thread each) with
``in_flight=1``: the sampler is asked for a trial only once the previous one is told, as
``optuna_integration.OptunaSearchCV(n_jobs=1)`` does, so the same seeded sampler proposes the
same parameters in the same order and the two searches pick the same best trial. (With more
trials in flight the sampler sees fewer results at each ask, and proposes differently.)
"""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")
optuna_integration = pytest.importorskip("optuna_integration")

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from pipelines.sklearn import OptunaSearchCV  # noqa: E402
from tests.sklearn_steps import RecordingScaler  # noqa: E402

X, Y = load_iris(return_X_y=True)
C = FloatDistribution(1e-3, 1e2, log=True)
N_TRIALS = 8

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning:optuna.*")]


@pytest.fixture(autouse=True)
def _quiet_optuna():
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(level)


def pipeline():
    return Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression(max_iter=300))])


def theirs(est, dists, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna_integration.OptunaSearchCV(est, dists, n_trials=N_TRIALS, cv=3, n_jobs=1, **kwargs).fit(X, Y)


@pytest.mark.parametrize("seeding", ["random_state", "random_sampler", "svc"])
def test_the_same_best_params_and_cv_results_as_optuna_integration(client, seeding):
    """Same seed, same proposals: the same trials, best_params_, best_score_, cv_results_ keys
    and scores (timings aside), and the same refitted predictions. ``random_state=0``: both
    seed their default TPESampler from the same draw; ``random_sampler``: the drop-in's
    ``sampler=`` against a study with the same sampler; ``svc``: an estimator that is not a
    Pipeline (one explore over the whole estimator) and a categorical parameter."""
    est, dists = pipeline(), {"clf__C": C}
    if seeding == "svc":
        est, dists = SVC(), {"C": C, "kernel": CategoricalDistribution(["linear", "rbf"])}
    if seeding == "random_sampler":
        ours = OptunaSearchCV(est, dists, n_trials=N_TRIALS, cv=3, sampler=optuna.samplers.RandomSampler(seed=0),
                              in_flight=1, client=client, progress=False).fit(X, Y)
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
        ref = theirs(est, dists, study=study)
    else:
        ours = OptunaSearchCV(est, dists, n_trials=N_TRIALS, cv=3, random_state=0, in_flight=1, client=client,
                              progress=False).fit(X, Y)
        ref = theirs(est, dists, random_state=0)
    assert ours.best_params_ == ref.best_params_
    assert ours.best_score_ == pytest.approx(ref.best_score_)
    assert ours.best_index_ == ref.best_index_ and ours.n_trials_ == ref.n_trials_ == N_TRIALS
    assert [t.params for t in ours.trials_] == [t.params for t in ref.trials_]
    assert list(ours.cv_results_) == list(ref.cv_results_)
    for key in ours.cv_results_:
        if "time" not in key:
            np.testing.assert_allclose(ours.cv_results_[key], ref.cv_results_[key], err_msg=key)
    assert ours.n_splits_ == ref.n_splits_ == 3
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    assert ours.score(X, Y) == ref.score(X, Y)
    assert isinstance(ours, optuna_integration.OptunaSearchCV)


def test_a_prefix_shared_by_every_trial_is_fitted_once_per_fold(client, log_dir):
    """Only the model's C is searched: the scaler and the PCA of every trial are the same tasks
    (one per prefix, every fold in it), so the scaler is fitted once per fold for the whole
    search (3 fits, not 3 per trial), and every task ran once: executed = unique < naive."""
    est = Pipeline([("scale", RecordingScaler(log_dir)), ("pca", PCA(2)), ("clf", LogisticRegression(max_iter=300))])
    search = OptunaSearchCV(est, {"clf__C": C}, n_trials=N_TRIALS, cv=3, random_state=0, client=client,
                            progress=False, refit=False).fit(X, Y)
    stats = search.quiver_result_.stats
    assert stats["complete"] == N_TRIALS
    # the data, the folds, the scaler, the PCA, and one model task per trial
    assert stats["executed_tasks"] == stats["unique_tasks"] == 4 + N_TRIALS
    assert stats["naive_tasks"] == 5 * N_TRIALS
    assert len(os.listdir(log_dir)) == 3


def test_searching_two_steps_shares_the_first_steps_values(client):
    """pca__n_components takes two values: the PCA runs once per value proposed, however many
    trials propose it."""
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA()), ("clf", LogisticRegression(max_iter=300))])
    search = OptunaSearchCV(est, {"pca__n_components": IntDistribution(2, 3), "clf__C": C}, n_trials=N_TRIALS, cv=3,
                            random_state=0, client=client, progress=False, refit=False).fit(X, Y)
    stats = search.quiver_result_.stats
    values = {t.params["pca__n_components"] for t in search.trials_}
    assert stats["executed_tasks"] == stats["unique_tasks"] == 3 + len(values) + N_TRIALS
    assert list(search.best_params_) == ["pca__n_components", "clf__C"]


def test_error_score_raise_raises_the_fit_error(client):
    est = Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression(max_iter=300))])
    search = OptunaSearchCV(est, {"clf__C": FloatDistribution(-2.0, -1.0)}, n_trials=2, cv=3, error_score="raise",
                            client=client, progress=False)
    with pytest.raises(RuntimeError, match="error_score='raise'"):
        search.fit(X, Y)


@pytest.mark.parametrize("kwargs, match", [
    ({"enable_pruning": True}, "enable_pruning is not supported yet"),
    ({"timeout": 10}, "timeout is not supported yet; give n_trials"),
    ({"n_trials": None}, "n_trials must be a whole number"),
    ({"scoring": ["accuracy", "f1_macro"]}, "scoring must be one metric"),
    ({"sampler": optuna.samplers.RandomSampler(), "study": optuna.create_study(direction="maximize")},
     "a sampler or a study, not both"),
    ({"study": optuna.create_study(direction="minimize")}, "direction of study must be 'maximize'"),
    ({"param_distributions": {"clf__C": [0.1, 1.0]}}, r"param_distributions\['clf__C'\] is a list"),
    ({"param_distributions": {}}, "non-empty mapping"),
    ({"param_distributions": {"clf__D": C}}, "Invalid parameter 'D'"),
])
def test_bad_input_is_refused_before_anything_runs(kwargs, match):
    args = {"param_distributions": {"clf__C": C}, **kwargs}
    dists = args.pop("param_distributions")
    with pytest.raises(ValueError, match=match):
        OptunaSearchCV(pipeline(), dists, **args).fit(X, Y)


def test_clone_and_pickle_keep_the_client(client):
    search = OptunaSearchCV(pipeline(), {"clf__C": C}, client=client, in_flight=2)
    assert clone(search).client is client and clone(search).get_params()["in_flight"] == 2
    assert pickle.loads(pickle.dumps(search)).client == client.scheduler.address
