"""Compile a scikit-learn search into one Quiver exploration.

Per group of folds: ``source(data) -> then(split_folds) -> explore(step 1) -> ... -> explore(step n)``,
one explore per pipeline step (named after it) over that step's distinct parameter points,
so every (step prefix, its parameters, group of folds) is one task, shared by all the
candidates that have that prefix.  The last level fits the final step and scores the
assembled pipeline exactly as scikit-learn's ``_fit_and_score`` does, fold by fold.  How the
folds are grouped is :func:`pipelines.sklearn.plan.fold_groups`'s rule: one group when the
candidates alone keep the cluster's threads busy (the last level then also summarises, so a
candidate costs one task), else smaller groups joined on the explores they share
(``pipelines.combine``, two at a time).  Each branch (one per candidate) ends in table
scalars (``split0_test_score``, ``mean_test_score``, ...).

>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> from sklearn.linear_model import LogisticRegression
>>> from sklearn.datasets import load_iris
>>> X, y = load_iris(return_X_y=True)
>>> est = make_pipeline(StandardScaler(), LogisticRegression())
>>> node = from_sklearn(est, {"logisticregression__C": [0.1, 1, 10]}, X, y, cv=3, threads=2)
>>> c = node.compile()
>>> len(c.branches), c.branches[0].choices["logisticregression"][1]
(3, {'logisticregression__C': 0.1})
>>> c.unique_tasks           # 3 candidates, 2 threads: a task per fold; data, 3 folds, 3 scalers, 9 fits, 6 joins, 3 summaries
25
>>> one_group = from_sklearn(est, {"logisticregression__C": [0.1, 1, 10, 100]}, X, y, cv=3, threads=1)
>>> one_group.compile().unique_tasks   # 4 candidates, 1 thread: data, the folds, the scaler, 4 fits that summarise
7
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ..builder import Pipeline, combine
from .config import captured
from .plan import SINGLE, Levels, fold_groups, plan_levels
from .steps import FinalConfig, FoldsStep, LevelStep, collect_folds, load_data, scores_transformed, split_folds, summarize
from .tokens import Est, param_token, unwrap, wrap

__all__ = ["Compiled", "build", "from_sklearn", "steps_of"]


@dataclass
class Compiled:
    """A compiled search: the node (one branch per distinct candidate) and how its
    branches map back to the candidates."""

    node: Any
    levels: Levels
    n_splits: int

    def candidate_token(self, choices: dict) -> str:
        """The token of the candidate a branch stands for, from its ``choices``."""
        params: dict = {}
        for name in self.levels.names:
            params.update(choices[name][1])
        return param_token(unwrap(params))


def steps_of(estimator: Any, fit_params: dict) -> list[str] | None:
    """The pipeline step names a search may split on, or ``None`` (split nothing) when the
    estimator is not a plain ``Pipeline``, routes metadata, transforms its input, ends in
    ``passthrough``, or is given fit parameters that are not ``step__param``."""
    from sklearn import get_config
    from sklearn.pipeline import Pipeline

    if type(estimator) is not Pipeline or get_config().get("enable_metadata_routing", False):
        return None
    if getattr(estimator, "transform_input", None) is not None:
        return None
    steps = estimator.steps
    if not steps or steps[-1][1] in (None, "passthrough"):
        return None
    names = [name for name, _ in steps]
    if any(k.split("__", 1)[0] not in names or "__" not in k for k in fit_params):
        return None
    return names


def _label(level: str, base: Any, params: dict, slot: bool) -> str:
    """An alternative's label: the class name of the estimator it fits (``passthrough``)."""
    est = params.get(level, base) if slot else base
    if est is None or isinstance(est, str):
        return "passthrough"
    return type(est).__name__


def build(
    estimator: Any,
    candidates: list[dict],
    X: Any,
    y: Any,
    splits: list,
    *,
    scorer: Any,
    return_train_score: bool,
    error_score: Any,
    fit_params: dict | None = None,
    score_params: dict | None = None,
    name: str = "sklearn-search",
    config: dict | None = None,
    report: str | None = None,
    threads: int | None = None,
) -> Compiled:
    """The exploration of ``candidates`` x ``splits`` as a Quiver node (nothing runs).
    ``config``: scikit-learn's configuration the steps run under (default: the one in force
    now, :func:`pipelines.sklearn.config.captured`); ``report``: the Dask event topic each fit's
    result is sent on, for the ``verbose`` lines (:mod:`pipelines.sklearn.verbose`); ``threads``:
    the threads the run will have, which decides how folds are grouped into tasks
    (:func:`pipelines.sklearn.plan.fold_groups`; default: an embedded cluster's)."""
    if config is None:
        config = captured()
    fit_params = dict(fit_params or {})
    names = steps_of(estimator, fit_params)
    levels = plan_levels(names, candidates, token=param_token)
    final = FinalConfig(scorer, return_train_score, error_score, estimator, report)
    bases = dict(estimator.steps) if levels.split else {SINGLE: estimator}
    transformed = scores_transformed(scorer)
    if not splits:
        raise ValueError("the cross-validation gave no splits")
    if threads is None:
        from gpu.clusters import default_workers

        threads = default_workers()
    groups = fold_groups(math.prod(len(a) for a in levels.alternatives), len(splits), threads)
    level_alts = []
    for i, (level, alternatives) in enumerate(zip(levels.names, levels.alternatives)):
        last = i == len(levels.names) - 1
        made: dict[str, FoldsStep] = {}
        alts = []
        for params in alternatives:
            label = _label(level, bases[level], params, levels.split)
            if label not in made:
                step = LevelStep(level, bases[level], slot=levels.split, final=final if last else None,
                                 label=label, transformed=transformed, train_scores=return_train_score)
                made[label] = FoldsStep(step, summary=last and len(groups) == 1, error_score=error_score)
            alts.append(functools.partial(made[label], **wrap(params)))
        level_alts.append(alts)
    data = Pipeline(name).source(load_data, X=X, y=y, fit_params=fit_params, score_params=dict(score_params or {}))
    nodes = []
    for group in groups:
        folds = tuple((index, splits[index][0], splits[index][1]) for index in group)
        node = data.then(split_folds, estimator=Est(estimator), folds=folds, config=config)
        for level, alts in zip(levels.names, level_alts):
            node = node.explore(level, *alts)
        nodes.append(node)
    if len(nodes) == 1:
        return Compiled(nodes[0], levels, len(splits))
    acc = nodes[0]
    for node in nodes[1:]:
        acc = combine(collect_folds, first=acc, second=node)
    return Compiled(acc.then(summarize, error_score=error_score), levels, len(splits))


def from_sklearn(
    estimator: Any,
    param_grid: Any,
    X: Any,
    y: Any = None,
    *,
    cv: Any = 5,
    scoring: Any = None,
    return_train_score: bool = False,
    error_score: Any = float("nan"),
    groups: Any = None,
    name: str = "sklearn-search",
    threads: int | None = None,
    **fit_params: Any,
):
    """A scikit-learn search as a Quiver node: one branch per candidate of ``param_grid``
    (a dict or list of dicts, as ``GridSearchCV`` takes), each branch's output the table
    scalars ``split<i>_test_<metric>``, ``mean_test_<metric>``, fit and score seconds.
    ``threads``: the threads of the cluster it will run on (default: an embedded cluster's),
    which decides how many folds one task fits (:func:`pipelines.sklearn.plan.fold_groups`).
    Explore names are the pipeline's step names (see :mod:`pipelines.sklearn.plan`), so you can
    go on: ``.choose("mean_test_score", per="clf")``, ``.run(memory_budget=...)``.

    >>> from sklearn.svm import SVC
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> node = from_sklearn(SVC(), {"C": [1, 10]}, X, y, cv=3).choose("mean_test_score")
    >>> node.run(quiet=True, progress=False).value["mean_test_score"] > 0.9   # doctest: +SKIP
    True
    """
    from sklearn.base import is_classifier
    from sklearn.model_selection import ParameterGrid, check_cv
    from sklearn.utils.validation import indexable

    from .candidates import check_candidates, scorers_for

    X, y = indexable(X, y)
    candidates = list(ParameterGrid(param_grid))
    check_candidates(estimator, candidates)
    scorer = scorers_for(estimator, scoring, error_score)
    splitter = check_cv(cv, y, classifier=is_classifier(estimator))
    splits = list(splitter.split(X, y, groups))
    return build(estimator, candidates, X, y, splits, scorer=scorer, return_train_score=return_train_score,
                 error_score=error_score, fit_params=fit_params, name=name, threads=threads).node
