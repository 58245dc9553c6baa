"""Drop-in ``GridSearchCV`` / ``RandomizedSearchCV`` that run as one Quiver exploration.

They *are* scikit-learn's classes (subclasses), with the same constructor arguments and
fitted attributes; only ``fit`` differs: the search is compiled into one Quiver exploration
(:mod:`pipelines.sklearn.exploration`) in which every (pipeline step prefix, its parameters,
fold) is one task, run on a Dask cluster, and the per-fold results are handed to
scikit-learn's own code for ``cv_results_``, fit-failure warnings and the refit.

Quiver's own arguments: ``client`` (a ``distributed.Client``, a scheduler address, or
``None`` for an embedded ``LocalCluster`` per fit), ``memory_budget`` (e.g. ``"2 GiB"``),
``store`` (a result-store directory: a rerun loads every fold fit it has already done) and
``progress``.  ``n_jobs`` and ``pre_dispatch`` are accepted and ignored: the cluster's
workers are the parallelism.  ``HalvingGridSearchCV`` is not provided yet: it needs the
pruning choose, which has not landed.

>>> from sklearn.svm import SVC
>>> from sklearn.datasets import load_iris
>>> X, y = load_iris(return_X_y=True)
>>> search = GridSearchCV(SVC(), {"C": [1, 10]}, cv=3).fit(X, y)   # doctest: +SKIP
>>> search.best_params_, search.cv_results_["mean_test_score"]     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from typing import Any

import numpy as np
from sklearn import model_selection as _ms
from sklearn.base import clone, is_classifier
from sklearn.model_selection import ParameterGrid, ParameterSampler, check_cv
from sklearn.utils.validation import indexable

from ._compat import (
    _MultimetricScorer,
    _check_method_params,
    _fit_context,
    _insert_error_scores,
    _warn_or_raise_about_fit_failures,
)
from .callbacks import Tree
from .candidates import NO_FITS, check_candidates
from .exploration import build
from .relay import CHUNK, reemit, unpack
from .results import Failed, fold_result, rows_by_candidate
from .steps import MeanTest
from .tokens import param_token
from .verbose import Lines, start_line

__all__ = ["GridSearchCV", "RandomizedSearchCV"]

_QUIVER_CONSTRAINTS = {"client": "no_validation", "memory_budget": "no_validation", "store": "no_validation",
                       "progress": ["boolean", None]}


def _scheduler_address(client: Any) -> str | None:
    """The scheduler address of a ``distributed.Client`` (``None`` for anything else)."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    if not isinstance(client, Client):
        return None
    return client.scheduler.address


class _QuiverSearch:
    """``fit`` for a scikit-learn search: one Quiver exploration instead of joblib."""

    def _candidates(self) -> list[dict]:  # pragma: no cover - each class defines it
        raise NotImplementedError

    # ---- a Client as ``client=``: passed by reference, pickled as its scheduler address ------
    def __sklearn_clone__(self):
        """``sklearn.base.clone``: scikit-learn's own clone, except that ``client`` is the same
        object in the clone (a ``Client`` holds a connection: it cannot be deep-copied, and the
        clone should run on the same cluster)."""
        proxy = copy.copy(self)  # shallow: self is left as it is (another thread may be using it)
        proxy.client = None
        new = super(_QuiverSearch, proxy).__sklearn_clone__()
        new.client = self.client
        return new

    def __getstate__(self):
        """Pickle as scikit-learn does; a ``Client`` given as ``client`` is pickled as its
        scheduler address (a connection cannot be pickled), so the unpickled search runs on the
        same scheduler if it is still there, and predicts without it."""
        state = dict(super().__getstate__())
        address = _scheduler_address(state.get("client"))
        if address is not None:
            state["client"] = address
        return state

    def _reraise_locally(self, X, y, params: dict, splits: list, routed: Any, scorers: Any, error: str) -> None:
        """A candidate's branch failed on the cluster: raise its own exception here, as
        scikit-learn would (the cluster sends only text), by redoing the candidate here fold by
        fold as scikit-learn's ``_fit_and_score`` does until it raises: the split (which fails
        whatever ``error_score`` is: a precomputed kernel that is not square), the fit (which
        raises with ``error_score='raise'``), the scoring (which raises with ``'raise'``, and
        for a multi-metric scorer always: unrequested metadata).  Returns if nothing raised."""
        from ._compat import _safe_split, _score

        for train, test in splits:
            est = clone(self.estimator).set_params(**clone(params, safe=False))
            X_train, y_train = _safe_split(est, X, y, train)
            X_test, y_test = _safe_split(est, X, y, test, train)
            fit_params = _check_method_params(X, params=routed.estimator.fit, indices=train)
            try:
                est.fit(X_train, **fit_params) if y_train is None else est.fit(X_train, y_train, **fit_params)
            except Exception:
                if self.error_score == "raise":
                    raise
                continue
            score_params = _check_method_params(X, params=routed.scorer.score, indices=test)
            _score(est, X_test, y_test, scorers, score_params, self.error_score)

    @staticmethod
    def _fold_args(base: Any, X: Any, y: Any, splits: list, routed: Any):
        """``(candidate, fold) -> X, y, metadata`` of that fit for the callback hooks, as
        callables (split here only if a hook asks; once per fold)."""
        import functools

        from ._compat import _safe_split

        @functools.lru_cache(maxsize=None)
        def fold(f: int):
            train = splits[f][0]
            X_train, y_train = _safe_split(base, X, y, train)
            fit_params = _check_method_params(X, params=routed.estimator.fit, indices=train)
            weight = fit_params.get("sample_weight")
            return X_train, y_train, None if weight is None else {"sample_weight": weight}

        def args(candidate: int, f: int) -> dict:
            return {"X": lambda: fold(f)[0], "y": lambda: fold(f)[1], "metadata": lambda: fold(f)[2]}

        return args

    @staticmethod
    def _relay_warnings(result: Any, rows: list[dict], candidates: list[dict]) -> None:
        """Raise the warnings the workers met here, candidate by candidate and fold by fold as
        scikit-learn's own loop meets them; the table keeps each candidate's ``warnings``
        summary, and ``table.attrs["warnings"]`` every record (candidate index, fold,
        category, message)."""
        met = []
        for index, row in enumerate(rows):
            for fold, (module, qualname, message, filename, lineno) in unpack(row):
                met.append({"candidate": index, "fold": fold, "category": qualname, "message": message,
                            "record": (module, qualname, message, filename, lineno)})
        table = result.table = result.table.drop(columns=[c for c in result.table.columns if str(c).startswith(CHUNK)])
        table.attrs["warnings"] = [{k: v for k, v in m.items() if k != "record"} for m in met]
        reemit([m["record"] for m in met])

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, **params):
        """Run the search as one Quiver exploration; the arguments are scikit-learn's.

        Sets scikit-learn's fitted attributes, plus ``quiver_result_`` (the run's
        :class:`pipelines.Result`: ``table`` with one row per distinct candidate, ``stats``).
        """
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        params = _check_method_params(X, params=params)
        routed = self._get_routed_params_for_fit(params)
        sample_weight = params.get("sample_weight")
        tree = Tree(self, refit=self.refit)
        tree.begin(X=X, y=y, metadata=None if sample_weight is None else {"sample_weight": sample_weight})
        cv = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        self.n_splits_ = cv.get_n_splits(X, y, **routed.splitter.split)
        splits = list(cv.split(X, y, **routed.splitter.split))
        if len(splits) != self.n_splits_:
            raise ValueError(
                "cv.split and cv.get_n_splits return inconsistent results. "
                f"Expected {self.n_splits_} splits, got {len(splits)}"
            )
        candidates = list(self._candidates())
        if not splits:
            raise ValueError(NO_FITS)
        check_candidates(self.estimator, candidates)
        base = clone(self.estimator)
        tokens = [param_token(c) for c in candidates]
        if self.verbose > 0:
            print(start_line(self.n_splits_, len(candidates)))
        lines = None
        if self.verbose > 1:
            lines = Lines(f"quiver-sklearn-cv-{uuid.uuid4().hex}", self.verbose, candidates, tokens, self.n_splits_,
                          self.return_train_score)
        compiled = build(
            base, candidates, X, y, splits,
            scorer=scorers, return_train_score=self.return_train_score, error_score=self.error_score,
            fit_params=routed.estimator.fit, score_params=routed.scorer.score,
            name=type(self).__name__, report=None if lines is None else lines.topic,
        )
        rank_by = refit_metric if isinstance(refit_metric, str) else None
        node = compiled.node.choose(MeanTest(rank_by), mode="max")
        with contextlib.ExitStack() as stack:
            client = self.client
            if lines is not None and isinstance(client, str):  # our own connection, to hear the fits finish
                from graph.cluster import connect

                client = stack.enter_context(connect(client, quiet=not self.verbose))
            if lines is not None and client is not None:
                lines.listen(client)
                stack.callback(lines.stop)
            result = node.run(client, progress=self.progress, store=self.store, memory_budget=self.memory_budget,
                              quiet=not self.verbose, raise_if_all_failed=False)
        self.quiver_result_ = result
        branches = (result.compiled or node.compile()).branches
        try:
            rows = rows_by_candidate(result.table, branches, lambda b: compiled.candidate_token(b.choices), tokens)
        except Failed as failed:
            index, row = failed.rows[0]
            self._reraise_locally(X, y, candidates[index], splits, routed, scorers, row.get("error"))
            raise RuntimeError(
                f"{failed} (and not when redone here, for {candidates[index]}). "
                f"Traceback from the worker:\n{row.get('traceback')}"
            ) from None
        self._relay_warnings(result, rows, candidates)
        names = list(scorers._scorers) if isinstance(scorers, _MultimetricScorer) else None
        out = [
            fold_result(row, f, multimetric_names=names, error_score=self.error_score, train=self.return_train_score)
            for row in rows
            for f in range(self.n_splits_)
        ]
        if lines is not None:  # the lines no event brought (an embedded cluster, results from a store)
            lines.finish([out[i * self.n_splits_:(i + 1) * self.n_splits_] for i in range(len(candidates))])
        tree.evaluated([(c, f) for c in range(len(candidates)) for f in range(self.n_splits_)],
                       self._fold_args(base, X, y, splits, routed))
        _warn_or_raise_about_fit_failures(out, self.error_score)
        if callable(self.scoring):
            _insert_error_scores(out, self.error_score)
        results = self._format_results(candidates, self.n_splits_, out, {})
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
            self.best_estimator_ = clone(base).set_params(**clone(self.best_params_, safe=False))
            with tree.refit_context(self.best_estimator_):
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
        tree.end()
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

    def _candidates(self) -> list[dict]:
        return list(ParameterGrid(self.param_grid))


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

    def _candidates(self) -> list[dict]:
        return list(ParameterSampler(self.param_distributions, self.n_iter, random_state=self.random_state))
