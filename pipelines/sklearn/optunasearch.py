"""``OptunaSearchCV``: ``optuna_integration``'s drop-in, run as one Quiver adaptive search.

A subclass of ``optuna_integration.OptunaSearchCV`` with the same arguments and fitted
attributes (``cv_results_``, ``best_params_``, ``best_score_``, ``best_estimator_``,
``best_trial_``, ``study_``, ``trials_``, ``n_trials_``, ``predict`` / ``score`` / ...
delegated to the refitted estimator); only ``fit`` differs: the trials are proposals of one
``node.search(...)`` (docs/guide/adaptive.md) on a Dask cluster, each trial a path of tasks,
one per pipeline step fitting every fold (:mod:`.trialsearch`). A step with the same
parameters and input is one task in every trial that proposes it: with only the model's
parameters searched, the scaler and PCA of ``Pipeline([scaler, pca, model])`` are fitted once
per fold for the whole search. Each trial's user attributes are ``optuna_integration``'s
(``split<i>_test_score``, ``mean_test_score``, ...), set before it is told.

Quiver's arguments: ``sampler`` (any Optuna sampler; default, as ``optuna_integration``'s,
``TPESampler`` seeded from ``random_state``), ``in_flight`` (trials running at a time; default
the cluster's threads; ``1`` asks the sampler only after the previous trial is told, as
``optuna_integration``'s ``n_jobs=1`` does, so a seeded sampler proposes the same), ``client``
(a ``distributed.Client``, an address, or ``None``: an embedded ``LocalCluster``) and
``progress``. ``n_jobs`` and ``catch`` are accepted and ignored (the cluster's workers are the
parallelism; a trial that fails is recorded and the search goes on). Not supported yet:
``enable_pruning``, ``timeout``, ``callbacks``, a multi-metric ``scoring``.

>>> from optuna.distributions import FloatDistribution
>>> from sklearn.datasets import load_iris
>>> from sklearn.linear_model import LogisticRegression
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> X, y = load_iris(return_X_y=True)
>>> search = OptunaSearchCV(make_pipeline(StandardScaler(), LogisticRegression()),
...                         {"logisticregression__C": FloatDistribution(1e-3, 1e2, log=True)},
...                         n_trials=8, cv=3, random_state=0)
>>> search.fit(X, y).best_params_                                    # doctest: +SKIP
{'logisticregression__C': 4.9...}
>>> search.quiver_result_.stats["executed_tasks"]                     # doctest: +SKIP
11
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from optuna_integration.sklearn import OptunaSearchCV as _OptunaSearchCV

from ..space import SUPPORTED
from .clientparam import ClientParam

__all__ = ["OptunaSearchCV"]


class OptunaSearchCV(ClientParam, _OptunaSearchCV):
    """``optuna_integration.OptunaSearchCV``, run as one Quiver adaptive search (module docstring).

    >>> OptunaSearchCV(None, {}, n_trials=3, in_flight=1).get_params()["in_flight"]
    1
    """

    def __init__(
        self,
        estimator,
        param_distributions,
        *,
        cv=None,
        enable_pruning=False,
        error_score=np.nan,
        max_iter=1000,
        n_jobs=None,
        n_trials=10,
        random_state=None,
        refit=True,
        return_train_score=False,
        scoring=None,
        study=None,
        subsample=1.0,
        timeout=None,
        verbose=0,
        callbacks=None,
        catch=(),
        sampler=None,
        in_flight=None,
        client=None,
        progress=None,
    ):
        # scikit-learn's convention: store the arguments as given, check them in fit (the parent's
        # __init__ is not called: it warns that optuna_integration's class is experimental)
        self.estimator = estimator
        self.param_distributions = param_distributions
        self.cv = cv
        self.enable_pruning = enable_pruning
        self.error_score = error_score
        self.max_iter = max_iter
        self.n_jobs = n_jobs
        self.n_trials = n_trials
        self.random_state = random_state
        self.refit = refit
        self.return_train_score = return_train_score
        self.scoring = scoring
        self.study = study
        self.subsample = subsample
        self.timeout = timeout
        self.verbose = verbose
        self.callbacks = callbacks
        self.catch = catch
        self.sampler = sampler
        self.in_flight = in_flight
        self.client = client
        self.progress = progress

    @property
    def cv_results_(self) -> dict:
        """optuna_integration's: each trial's user attributes, one list per key, in trial order;
        a trial without one (it failed before its scores were made) has NaN there (the parent
        takes the first trial's keys and fails on a trial that lacks one)."""
        attrs = [t.user_attrs for t in self.trials_]
        keys = list(dict.fromkeys(k for a in attrs for k in a))
        return {k: [a.get(k, np.nan) for a in attrs] for k in keys}

    # ---- checks ----------------------------------------------------------------------------
    def _check_params(self) -> None:
        """Refuse what this drop-in cannot run, naming the fix, before anything runs."""
        import optuna

        where = "pipelines.sklearn.OptunaSearchCV"
        if not hasattr(self.estimator, "fit"):
            raise ValueError(f"{where}: estimator must be a scikit-learn estimator (with fit), got "
                             f"{type(self.estimator).__name__}.")
        if not isinstance(self.param_distributions, Mapping) or not self.param_distributions:
            raise ValueError(
                f"{where}: param_distributions must be a non-empty mapping of parameter names to Optuna "
                "distributions, e.g. {'clf__C': FloatDistribution(1e-3, 1e2, log=True)}.")
        for name, dist in self.param_distributions.items():
            if not any(cls.__name__ in SUPPORTED for cls in type(dist).__mro__) or \
                    not isinstance(dist, optuna.distributions.BaseDistribution):
                raise ValueError(
                    f"{where}: param_distributions[{name!r}] is a {type(dist).__name__}; give an "
                    f"optuna.distributions {' / '.join(SUPPORTED)}, e.g. FloatDistribution(1e-3, 1e2, log=True) "
                    "or CategoricalDistribution(['a', 'b']).")
        from .candidates import check_candidates

        check_candidates(self.estimator, [{name: None for name in self.param_distributions}])
        n = self.n_trials
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"{where}: n_trials must be a whole number >= 1, got {n!r} (a search without "
                             "a number of trials, stopped by timeout, is not supported yet).")
        unsupported = [("enable_pruning", bool(self.enable_pruning), "leave it False"),
                       ("timeout", self.timeout is not None, "give n_trials instead"),
                       ("callbacks", bool(self.callbacks), "read search.trials_ after fit instead")]
        for arg, given, fix in unsupported:
            if given:
                raise ValueError(f"{where}: {arg} is not supported yet; {fix} (or use "
                                 "optuna_integration.OptunaSearchCV).")
        if isinstance(self.scoring, (list, tuple, set, dict)):
            raise ValueError(f"{where}: scoring must be one metric (a name, a scorer or None), got a "
                             f"{type(self.scoring).__name__}; OptunaSearchCV tells the study one value.")
        if self.sampler is not None and self.study is not None:
            raise ValueError(f"{where}: give a sampler or a study, not both: the study's own sampler proposes.")
        if self.study is not None and self.study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise ValueError(f"{where}: the direction of study must be 'maximize' (scikit-learn's scores are "
                             "higher-is-better); create it with optuna.create_study(direction='maximize').")

    # ---- fit -------------------------------------------------------------------------------
    def fit(self, X, y=None, groups=None, **fit_params):
        """Run the search on the cluster, then refit the best parameters here (``refit=True``);
        the arguments are ``optuna_integration``'s. Sets its fitted attributes, plus
        ``quiver_result_`` (the :class:`pipelines.SearchResult`: ``table`` one row per trial,
        ``stats`` with ``unique_tasks``, ``executed_tasks``, ``naive_tasks``)."""
        import optuna
        from sklearn.base import is_classifier
        from sklearn.metrics import check_scoring
        from sklearn.model_selection import check_cv
        from sklearn.utils import _safe_indexing, check_random_state

        from ._compat import _check_method_params, _num_samples
        from .trialsearch import build_search

        self._check_params()
        random_state = check_random_state(self.random_state)
        n_samples = _num_samples(X)
        self.sample_indices_ = np.arange(n_samples)
        max_samples = self.subsample
        if isinstance(max_samples, float):
            max_samples = int(max_samples * n_samples)
        if max_samples < n_samples:  # as optuna_integration subsamples (the same draw for the same seed)
            self.sample_indices_ = np.sort(random_state.choice(self.sample_indices_, max_samples, replace=False))
        index = self.sample_indices_

        def take(v):
            return None if v is None else _safe_indexing(v, index)

        X_res, y_res, groups_res = take(X), take(y), take(groups)
        fit_params_res = _check_method_params(X, params=fit_params, indices=index)
        cv = check_cv(self.cv, y_res, classifier=is_classifier(self.estimator))
        self.n_splits_ = cv.get_n_splits(X_res, y_res, groups=groups_res)
        self.scorer_ = check_scoring(self.estimator, scoring=self.scoring)
        if self.study is None:
            sampler = self.sampler
            if sampler is None:  # optuna_integration's default, from the same draw of random_state
                sampler = optuna.samplers.TPESampler(seed=random_state.randint(0, np.iinfo("int32").max))
            self.study_ = optuna.create_study(direction="maximize", sampler=sampler)
        else:
            self.study_ = self.study
        node = build_search(
            self.estimator, self.param_distributions, X_res, y_res, list(cv.split(X_res, y_res, groups_res)),
            scorer=self.scorer_, n_trials=self.n_trials, return_train_score=self.return_train_score,
            error_score=self.error_score, fit_params=fit_params_res, study=self.study_, in_flight=self.in_flight,
        )
        self.quiver_result_ = _run(node, self.client, self.progress, self.verbose, self.error_score)
        if self.refit:  # as optuna_integration refits: the whole data, the study's best parameters
            from sklearn.base import clone

            self.best_estimator_ = clone(self.estimator).set_params(**self.study_.best_params)
            start = time.time()
            self.best_estimator_.fit(X, y, **fit_params)
            self.refit_time_ = time.time() - start
        return self


def _run(node: Any, client: Any, progress: Any, verbose: Any, error_score: Any) -> Any:
    """Run the search; with ``error_score="raise"`` a trial whose fit failed raises its error here."""
    import graph

    from ..runner import run_search_node
    from .steps import FitFailed

    result = run_search_node(node, client, progress=progress, quiet=not verbose, raise_if_all_failed=False)
    table = result.table
    failed = table[table["state"] == "FAIL"] if "state" in table else table.iloc[:0]
    if error_score == "raise" and len(failed):
        row = failed.iloc[0]
        raise FitFailed(f"trial {row['trial']} failed ({row['error']}); error_score='raise'. "
                        f"Traceback from the worker:\n{row.get('traceback')}")
    if not result.stats.get("complete"):
        first = failed.iloc[0]["error"] if len(failed) else "no trial ran"
        exc = graph.RunError(f"every trial of the search failed; the first: {first}")
        exc.result = result  # type: ignore[attr-defined]
        raise exc
    return result
