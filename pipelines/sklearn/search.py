"""Drop-in scikit-learn searches that run as Quiver explorations on a Dask cluster.

They *are* scikit-learn's classes (subclasses), with the same constructor arguments and
fitted attributes; only ``fit`` differs: the search is compiled into one Quiver exploration
(:mod:`pipelines.sklearn.exploration`) in which every (pipeline step prefix, its parameters,
group of folds) is one task, run on a Dask cluster, and the per-fold results are handed to
scikit-learn's own code for ``cv_results_``, fit-failure warnings and the refit.

Quiver's own arguments: ``client`` (a ``distributed.Client``, a scheduler address, or
``None`` for an embedded ``LocalCluster`` per fit), ``memory_budget`` (e.g. ``"2 GiB"``),
``store`` (a result-store directory: a rerun loads every fold fit it has already done),
``progress`` and ``tracking`` (an MLflow tracking URI or ``pipelines.tracking.MLflow``: each
Quiver run is a parent run, each candidate a child run; :mod:`pipelines.tracking`).
``n_jobs`` and ``pre_dispatch`` are accepted and ignored: the cluster's
workers are the parallelism.  ``HalvingGridSearchCV`` / ``HalvingRandomSearchCV`` run
scikit-learn's own successive halving, each iteration one Quiver run over the surviving
candidates with that iteration's resource.  What is identical to scikit-learn and what
differs: docs/sklearn-dropin.md.

>>> from sklearn.svm import SVC
>>> from sklearn.datasets import load_iris
>>> X, y = load_iris(return_X_y=True)
>>> search = GridSearchCV(SVC(), {"C": [1, 10]}, cv=3).fit(X, y)   # doctest: +SKIP
>>> search.best_params_, search.cv_results_["mean_test_score"]     # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import numpy as np
from sklearn import model_selection as _ms
from sklearn.base import clone, is_classifier
from sklearn.experimental import enable_halving_search_cv  # noqa: F401  (scikit-learn's halving classes)
from sklearn.model_selection import HalvingGridSearchCV as _SkHalvingGrid
from sklearn.model_selection import HalvingRandomSearchCV as _SkHalvingRandom
from sklearn.model_selection import check_cv
from sklearn.utils.validation import indexable

from ._compat import _MultimetricScorer, _check_method_params, _fit_context, _num_samples
from .callbacks import refit_hooks, root_context
from .clientparam import ClientParam
from .evaluate import Evaluator

__all__ = ["GridSearchCV", "RandomizedSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV"]

_QUIVER_CONSTRAINTS = {"client": "no_validation", "memory_budget": "no_validation", "store": "no_validation",
                       "progress": ["boolean", None], "tracking": "no_validation"}


class _QuiverSearch(ClientParam):
    """``fit`` for a scikit-learn search: one Quiver exploration instead of joblib (``client``:
    :class:`.clientparam.ClientParam`)."""

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, **params):
        """Run the search on the cluster; the arguments are scikit-learn's.

        As scikit-learn's ``fit``, with scikit-learn's own ``_run_search`` choosing what to
        evaluate; each batch of candidates it evaluates is one Quiver run
        (:class:`pipelines.sklearn.evaluate.Evaluator`).  Sets scikit-learn's fitted
        attributes, plus ``quiver_result_`` (the last run's :class:`pipelines.Result`: ``table``
        with one row per distinct candidate, ``stats``) and ``quiver_results_`` (every run's).
        """
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        params = _check_method_params(X, params=params)
        routed = self._get_routed_params_for_fit(params)
        sample_weight = params.get("sample_weight")
        metadata = None if sample_weight is None else {"sample_weight": sample_weight}
        root = root_context(self, X=X, y=y, metadata=metadata)
        self._checked_cv_orig = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        if hasattr(self, "_check_input_parameters"):  # where scikit-learn has it (the halving searches check there)
            self._check_input_parameters(X=X, y=y, split_params=routed.splitter.split)
        self.n_splits_ = self._checked_cv_orig.get_n_splits(X, y, **routed.splitter.split)
        evaluate = Evaluator(self, X, y, routed, scorers, refit_metric)
        try:
            if root is not None and "callback_ctx" in inspect.signature(self._run_search).parameters:
                self._run_search(evaluate, callback_ctx=root)
            else:
                self._run_search(evaluate)
        finally:
            if evaluate.runs:
                self.quiver_results_ = list(evaluate.runs)
                self.quiver_result_ = evaluate.runs[-1]
        results, out = evaluate.results, evaluate.out
        self.multimetric_ = isinstance(out[0]["test_scores"], dict)
        if callable(self.scoring) and self.multimetric_:
            self._check_refit_for_multimetric(out[0]["test_scores"])
            refit_metric = self.refit
        if self.refit or not self.multimetric_:
            self.best_index_ = self._select_best_index(self.refit, refit_metric, results)
            if not callable(self.refit):
                self.best_score_ = results[f"mean_test_{refit_metric}"][self.best_index_]
            self.best_params_ = results["params"][self.best_index_]
        if self.refit:
            self.best_estimator_ = clone(evaluate.base).set_params(**clone(self.best_params_, safe=False))
            with refit_hooks(root, self, self.best_estimator_, X=X, y=y, metadata=metadata):
                start = time.time()
                if y is not None:
                    self.best_estimator_.fit(X, y, **routed.estimator.fit)
                else:
                    self.best_estimator_.fit(X, **routed.estimator.fit)
                self.refit_time_ = time.time() - start
            if hasattr(self.best_estimator_, "feature_names_in_"):
                self.feature_names_in_ = self.best_estimator_.feature_names_in_
        self.scorer_ = scorers._scorers if isinstance(scorers, _MultimetricScorer) else scorers
        self.cv_results_ = results
        if root is not None:
            root.call_on_fit_task_end(estimator=self, X=X, y=y, metadata=metadata)
        return self


class GridSearchCV(_QuiverSearch, _ms.GridSearchCV):
    """scikit-learn's ``GridSearchCV``, run as one Quiver exploration (see the module docstring).

    Every (pipeline step prefix, its parameters, fold) is fitted once, shared by all the
    candidates with that prefix.  ``n_jobs`` and ``pre_dispatch`` are ignored.
    """

    _parameter_constraints: dict = {**_ms.GridSearchCV._parameter_constraints, **_QUIVER_CONSTRAINTS}

    def __init__(
        self,
        estimator,
        param_grid,
        *,
        scoring=None,
        n_jobs=None,
        refit=True,
        cv=None,
        verbose=0,
        pre_dispatch="2*n_jobs",
        error_score=np.nan,
        return_train_score=False,
        client=None,
        memory_budget=None,
        store=None,
        progress=None,
        tracking=None,
    ):
        super().__init__(
            estimator,
            param_grid,
            scoring=scoring,
            n_jobs=n_jobs,
            refit=refit,
            cv=cv,
            verbose=verbose,
            pre_dispatch=pre_dispatch,
            error_score=error_score,
            return_train_score=return_train_score,
        )
        self.client = client
        self.memory_budget = memory_budget
        self.store = store
        self.progress = progress
        self.tracking = tracking


class RandomizedSearchCV(_QuiverSearch, _ms.RandomizedSearchCV):
    """scikit-learn's ``RandomizedSearchCV``, run as one Quiver exploration.

    The candidates are scikit-learn's (``ParameterSampler`` with the same ``random_state``).
    Prefixes are shared when the sampled candidates are a product over the pipeline's steps
    (e.g. only one step's parameters are sampled); otherwise each candidate is one task per fold.
    """

    _parameter_constraints: dict = {**_ms.RandomizedSearchCV._parameter_constraints, **_QUIVER_CONSTRAINTS}

    def __init__(
        self,
        estimator,
        param_distributions,
        *,
        n_iter=10,
        scoring=None,
        n_jobs=None,
        refit=True,
        cv=None,
        verbose=0,
        pre_dispatch="2*n_jobs",
        random_state=None,
        error_score=np.nan,
        return_train_score=False,
        client=None,
        memory_budget=None,
        store=None,
        progress=None,
        tracking=None,
    ):
        super().__init__(
            estimator,
            param_distributions,
            n_iter=n_iter,
            scoring=scoring,
            n_jobs=n_jobs,
            refit=refit,
            cv=cv,
            verbose=verbose,
            pre_dispatch=pre_dispatch,
            random_state=random_state,
            error_score=error_score,
            return_train_score=return_train_score,
        )
        self.client = client
        self.memory_budget = memory_budget
        self.store = store
        self.progress = progress
        self.tracking = tracking


class _QuiverHalving(_QuiverSearch):
    """``fit`` of the halving searches: scikit-learn's bookkeeping around :class:`_QuiverSearch`'s."""

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, **params):
        """Run scikit-learn's successive halving, each iteration one Quiver run over the
        candidates left, with that iteration's resource (subsampled folds for
        ``resource="n_samples"``, else the estimator parameter set in each candidate).

        Shared: inside an iteration, the pipeline prefixes its candidates have in common
        (when they are a product over the steps, see :mod:`pipelines.sklearn.plan`); between
        iterations nothing (each is its own run; ``n_samples`` subsamples each one's folds).
        """
        self._n_samples_orig = _num_samples(X)
        _QuiverSearch.fit.__wrapped__(self, X, y, **params)
        self.best_score_ = self.cv_results_["mean_test_score"][self.best_index_]
        return self


class HalvingGridSearchCV(_QuiverHalving, _SkHalvingGrid):
    """scikit-learn's ``HalvingGridSearchCV`` (same arguments, ``cv_results_`` with ``iter``
    and ``n_resources``, ``n_candidates_``, ``n_resources_``, ...), each iteration one Quiver
    run; plus ``client``, ``memory_budget``, ``store``, ``progress``.  ``n_jobs`` is ignored.

    >>> HalvingGridSearchCV(None, {}, factor=2).get_params()["factor"]
    2
    """

    _parameter_constraints: dict = {**_SkHalvingGrid._parameter_constraints, **_QUIVER_CONSTRAINTS}

    def __init__(
        self,
        estimator,
        param_grid,
        *,
        factor=3,
        resource="n_samples",
        max_resources="auto",
        min_resources="exhaust",
        aggressive_elimination=False,
        cv=5,
        scoring=None,
        refit=True,
        error_score=np.nan,
        return_train_score=True,
        random_state=None,
        n_jobs=None,
        verbose=0,
        client=None,
        memory_budget=None,
        store=None,
        progress=None,
        tracking=None,
    ):
        super().__init__(
            estimator,
            param_grid,
            factor=factor,
            resource=resource,
            max_resources=max_resources,
            min_resources=min_resources,
            aggressive_elimination=aggressive_elimination,
            cv=cv,
            scoring=scoring,
            refit=refit,
            error_score=error_score,
            return_train_score=return_train_score,
            random_state=random_state,
            n_jobs=n_jobs,
            verbose=verbose,
        )
        self.client = client
        self.memory_budget = memory_budget
        self.store = store
        self.progress = progress
        self.tracking = tracking


class HalvingRandomSearchCV(_QuiverHalving, _SkHalvingRandom):
    """scikit-learn's ``HalvingRandomSearchCV`` (same arguments and attributes), each
    iteration one Quiver run; plus ``client``, ``memory_budget``, ``store``, ``progress``.

    >>> HalvingRandomSearchCV(None, {}, n_candidates=9).get_params()["n_candidates"]
    9
    """

    _parameter_constraints: dict = {**_SkHalvingRandom._parameter_constraints, **_QUIVER_CONSTRAINTS}

    def __init__(
        self,
        estimator,
        param_distributions,
        *,
        n_candidates="exhaust",
        factor=3,
        resource="n_samples",
        max_resources="auto",
        min_resources="smallest",
        aggressive_elimination=False,
        cv=5,
        scoring=None,
        refit=True,
        error_score=np.nan,
        return_train_score=True,
        random_state=None,
        n_jobs=None,
        verbose=0,
        client=None,
        memory_budget=None,
        store=None,
        progress=None,
        tracking=None,
    ):
        super().__init__(
            estimator,
            param_distributions,
            n_candidates=n_candidates,
            factor=factor,
            resource=resource,
            max_resources=max_resources,
            min_resources=min_resources,
            aggressive_elimination=aggressive_elimination,
            cv=cv,
            scoring=scoring,
            refit=refit,
            error_score=error_score,
            return_train_score=return_train_score,
            random_state=random_state,
            n_jobs=n_jobs,
            verbose=verbose,
        )
        self.client = client
        self.memory_budget = memory_budget
        self.store = store
        self.progress = progress
        self.tracking = tracking
