"""An ``OptunaSearchCV`` fit as one Quiver search: each trial a path of per-step tasks, every fold in each.

:func:`build_search` turns an estimator, Optuna distributions keyed like scikit-learn's
parameters (``"clf__C"``) and the cross-validation splits into a ``node.search(...)``:
``source(data) -> then(split_folds) -> explore(step 1) -> ... -> explore(step n)``, one explore
per pipeline step with one alternative, a ``space(...)`` of the distributions of that step's
parameters (a step with none searched is a plain alternative). Every (step prefix, its
parameters) is one task fitting that prefix on every fold, so trials whose proposals share a
prefix (only the model's ``C`` searched: the scaler and PCA) share its task: it runs once.
The last level fits the final step, scores each fold as scikit-learn's ``cross_validate``
does, and returns what ``optuna_integration``'s objective stores as the trial's user
attributes (:func:`trial_scores`); the search sets them on the trial before telling it
``mean_test_score`` (``SearchSpec.user_attrs``), and asks the sampler the parameters by the
names the user gave (``SearchSpec.param_names="plain"``). An estimator that is not a plain
``Pipeline``, or a parameter of the pipeline itself, makes one explore over the whole estimator.

>>> from optuna.distributions import FloatDistribution
>>> from sklearn.datasets import load_iris
>>> from sklearn.linear_model import LogisticRegression
>>> from sklearn.metrics import check_scoring
>>> from sklearn.model_selection import KFold
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> X, y = load_iris(return_X_y=True)
>>> est = make_pipeline(StandardScaler(), LogisticRegression())
>>> node = build_search(est, {"logisticregression__C": FloatDistribution(1e-2, 1e2, log=True)}, X, y,
...                     list(KFold(3).split(X)), scorer=check_scoring(est), n_trials=4)
>>> node
<Node pipeline 'OptunaSearchCV', search('mean_test_score'): up to 1 branch>
>>> node.spec.param_names, [e.name for e in (node.spec.input, node.spec.input.input)]
('plain', ['logisticregression', 'standardscaler'])
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .steps import (FinalConfig, FitFailed, FoldsStep, LevelStep, load_data, scores_transformed, split_folds)
from .plan import SINGLE, step_of
from .tokens import Est

__all__ = ["build_search", "TrialScores", "trial_scores"]


def trial_scores(folds: list, /, *, error_score: Any) -> dict:
    """A trial's folds as ``optuna_integration``'s objective stores them (its ``_store_scores``,
    in its order): ``mean_fit_time``, ``std_fit_time``, ``mean_score_time``,
    ``std_score_time``, ``split<i>_test_score``, ``mean_test_score``, ``std_test_score``, and
    the same for ``train_score`` when the folds have train scores. Means and deviations are
    ``np.nanmean`` / ``np.nanstd`` (a fold that failed, scored ``error_score=nan``, is left out).
    With ``error_score="raise"`` a failed fit raises :class:`~.steps.FitFailed` (the trial fails).

    >>> folds = [{"test_scores": 0.5, "fit_time": 0.1, "score_time": 0.0, "fit_error": None},
    ...          {"test_scores": 1.0, "fit_time": 0.3, "score_time": 0.0, "fit_error": None}]
    >>> s = trial_scores(folds, error_score=float("nan"))
    >>> list(s)[:5], s["mean_test_score"], s["std_test_score"]
    (['mean_fit_time', 'std_fit_time', 'mean_score_time', 'std_score_time', 'split0_test_score'], 0.75, 0.25)
    """
    for i, fold in enumerate(folds):
        if fold["fit_error"] is not None and error_score == "raise":
            raise FitFailed(f"fit failed on fold {i}:\n{fold['fit_error']}")
    arrays = {"fit_time": [f["fit_time"] for f in folds], "score_time": [f["score_time"] for f in folds],
              "test_score": [f["test_scores"] for f in folds]}
    if folds and "train_scores" in folds[0]:
        arrays["train_score"] = [f["train_scores"] for f in folds]
    out: dict[str, Any] = {}
    for name, values in arrays.items():
        array = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        if name in ("test_score", "train_score"):
            for i, v in enumerate(array):
                out[f"split{i}_{name}"] = float(v)
        with warnings.catch_warnings():  # every fold failed: NaN, which fails the trial
            warnings.simplefilter("ignore", RuntimeWarning)
            out[f"mean_{name}"] = float(np.nanmean(array))
            out[f"std_{name}"] = float(np.nanstd(array))
    return out


class TrialScores:
    """The last level of a trial: the final :class:`~.steps.LevelStep` on every fold's prefix,
    then :func:`trial_scores` (one task per trial).

    >>> TrialScores(LevelStep("clf", None, slot=True, final=None, label="SVC"), error_score=0.0).__name__
    'SVC'
    """

    def __init__(self, step: LevelStep, *, error_score: Any):
        self.step = step
        self.error_score = error_score
        self.__name__ = step.__name__

    def __dask_tokenize__(self) -> Any:
        return ("TrialScores", self.step.__dask_tokenize__(), repr(self.error_score))

    def __repr__(self) -> str:
        return f"TrialScores({self.step!r})"

    def __call__(self, prevs: list, /, **params: Any) -> dict:
        return trial_scores([self.step(prev, **params) for prev in prevs], error_score=self.error_score)


def _levels(estimator: Any, keys: list[str], fit_params: dict) -> tuple[list[str], bool]:
    """The explores: the pipeline's steps when every searched parameter is a step's, else one."""
    from .exploration import steps_of

    names = steps_of(estimator, fit_params)
    if not names or SINGLE in names or any(step_of(k, names) is None for k in keys):
        return [SINGLE], False
    return names, True


def _label(base: Any) -> str:
    return "passthrough" if base is None or isinstance(base, str) else type(base).__name__


def build_search(
    estimator: Any,
    param_distributions: Mapping[str, Any],
    X: Any,
    y: Any,
    splits: list,
    *,
    scorer: Any,
    n_trials: int,
    return_train_score: bool = False,
    error_score: Any = float("nan"),
    fit_params: dict | None = None,
    sampler: Any = None,
    study: Any = None,
    in_flight: int | None = None,
    name: str = "OptunaSearchCV",
) -> Any:
    """The search node of an ``OptunaSearchCV`` fit (module docstring; nothing runs).
    ``splits``: the ``(train, test)`` index pairs; ``scorer``: one scikit-learn scorer."""
    from ..builder import Node, Pipeline
    from ..space import space
    from .config import captured

    if not splits:
        raise ValueError("the cross-validation gave no splits")
    fit_params = dict(fit_params or {})
    levels, split = _levels(estimator, list(param_distributions), fit_params)
    bases = dict(estimator.steps) if split else {SINGLE: estimator}
    final = FinalConfig(scorer, return_train_score, error_score, estimator)
    transformed = scores_transformed(scorer)
    data = Pipeline(name).source(load_data, X=X, y=y, fit_params=fit_params, score_params={})
    folds = tuple((i, train, test) for i, (train, test) in enumerate(splits))
    node = data.then(split_folds, estimator=Est(estimator), folds=folds, config=captured())
    for i, level in enumerate(levels):
        last = i == len(levels) - 1
        step = LevelStep(level, bases[level], slot=split, final=final if last else None, label=_label(bases[level]),
                         transformed=transformed, train_scores=return_train_score)
        fn = TrialScores(step, error_score=error_score) if last else FoldsStep(step)
        dists = {k: d for k, d in param_distributions.items() if not split or step_of(k, levels) == level}
        node = node.explore(level, **{step.__name__: space(fn, **dists) if dists else fn})
    search = node.search("mean_test_score", "max", n_trials=n_trials, sampler=sampler, study=study, in_flight=in_flight)
    return Node(dataclasses.replace(search.spec, param_names="plain", user_attrs=True))
