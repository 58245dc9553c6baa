"""``evaluate_candidates`` for scikit-learn's ``_run_search``: one Quiver run per call.

scikit-learn's searches hand their ``_run_search`` a function that fits and scores a list of
candidates on the folds of a splitter and returns ``cv_results_`` so far (a grid search calls
it once; a successive-halving search once per iteration, with a subsampling splitter or the
resource set in each candidate).  :class:`Evaluator` is that function: each call compiles the
candidates into one exploration (:mod:`pipelines.sklearn.exploration`), runs it, raises the
workers' warnings here, prints the ``verbose`` lines, calls the callbacks of the
(candidate, fold) tasks, and hands the per-fold results to scikit-learn's own
``_warn_or_raise_about_fit_failures`` and ``_format_results``.

>>> from sklearn.linear_model import Ridge
>>> from pipelines.sklearn import GridSearchCV
>>> evaluate = Evaluator(GridSearchCV(Ridge(), {"alpha": [1.0]}), None, None, None, None, "score")
>>> evaluate.results, evaluate.runs         # nothing evaluated yet
({}, [])
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections import defaultdict
from typing import Any

from sklearn.base import clone

from ._compat import (
    _MultimetricScorer,
    _check_method_params,
    _insert_error_scores,
    _warn_or_raise_about_fit_failures,
)
from .callbacks import evaluation_hooks
from .candidates import NO_FITS, check_candidates
from .exploration import build
from .relay import CHUNK, reemit, unpack
from .results import Failed, fold_result, rows_by_candidate
from .steps import MeanTest
from .tokens import param_token, tokens_remembered
from .verbose import Lines, start_line

__all__ = ["Evaluator"]


class Evaluator:
    """The ``evaluate_candidates`` of one ``fit`` of ``search`` (its results accumulate over
    calls, as scikit-learn's do); ``runs``: each call's :class:`pipelines.Result`."""

    def __init__(self, search: Any, X: Any, y: Any, routed: Any, scorers: Any, refit_metric: Any):
        self.search, self.X, self.y, self.routed = search, X, y, routed
        self.scorers, self.refit_metric = scorers, refit_metric
        self.base = clone(search.estimator)
        self.candidates: list[dict] = []
        self.out: list[dict] = []
        self.more: dict[str, list] = defaultdict(list)
        self.runs: list = []
        self.results: dict = {}

    def __call__(self, candidate_params, cv=None, more_results=None, callback_ctx=None) -> dict:
        """Fit and score ``candidate_params`` on the folds of ``cv`` (default: the search's), as one run."""
        s, X, y, routed = self.search, self.X, self.y, self.routed
        cv = cv or s._checked_cv_orig
        candidates = list(candidate_params)
        n_splits = s.n_splits_
        splits = list(cv.split(X, y, **routed.splitter.split))
        if len(splits) != n_splits:
            raise ValueError(
                "cv.split and cv.get_n_splits return inconsistent results. "
                f"Expected {n_splits} splits, got {len(splits)}"
            )
        if s.verbose > 0:
            print(start_line(n_splits, len(candidates)))
        if not splits:
            raise ValueError(NO_FITS)
        check_candidates(s.estimator, candidates)
        out = self._run(candidates, splits)
        if callback_ctx is not None:
            evaluation_hooks(callback_ctx, s, [(c, f) for c in range(len(candidates)) for f in range(n_splits)],
                             self._fold_args(splits))
        _warn_or_raise_about_fit_failures(out, s.error_score)
        if callable(s.scoring):
            _insert_error_scores(out, s.error_score)
        self.candidates.extend(candidates)
        self.out.extend(out)
        for key, value in (more_results or {}).items():
            self.more[key].extend(value)
        self.results = s._format_results(self.candidates, n_splits, self.out, self.more)
        return self.results

    def _run(self, candidates: list[dict], splits: list) -> list[dict]:
        """One Quiver run of ``candidates`` x ``splits``: what ``_fit_and_score`` returned for
        each, candidate-major (every object's token worked out once: ``tokens_remembered``)."""
        with tokens_remembered():
            return self._run_remembered(candidates, splits)

    def _run_remembered(self, candidates: list[dict], splits: list) -> list[dict]:
        s, X, y, routed = self.search, self.X, self.y, self.routed
        tokens = [param_token(c) for c in candidates]
        lines = None
        if s.verbose > 1:
            lines = Lines(f"quiver-sklearn-cv-{uuid.uuid4().hex}", s.verbose, candidates, tokens, len(splits),
                          s.return_train_score)
        compiled = build(
            self.base, candidates, X, y, splits,
            scorer=self.scorers, return_train_score=s.return_train_score, error_score=s.error_score,
            fit_params=routed.estimator.fit, score_params=routed.scorer.score,
            name=type(s).__name__, report=None if lines is None else lines.topic, threads=_threads(s.client),
        )
        rank_by = self.refit_metric if isinstance(self.refit_metric, str) else None
        node = compiled.node.choose(MeanTest(rank_by), mode="max")
        with contextlib.ExitStack() as stack:
            client = s.client
            if lines is not None and isinstance(client, str):  # our own connection, to hear the fits finish
                from graph.cluster.connect import connect

                client = stack.enter_context(connect(client, quiet=not s.verbose))
            if lines is not None and client is not None:
                lines.listen(client)
                stack.callback(lines.stop)
            result = node.run(client, progress=s.progress, store=s.store, memory_budget=s.memory_budget,
                              quiet=not s.verbose, raise_if_all_failed=False, tracking=getattr(s, "tracking", None))
        self.runs.append(result)
        branches = (result.compiled or node.compile()).branches
        try:
            rows = rows_by_candidate(result.table, branches, lambda b: compiled.candidate_token(b.choices), tokens)
        except Failed as failed:
            index, row = failed.rows[0]
            self._reraise_locally(candidates[index], splits)
            raise RuntimeError(
                f"{failed} (and not when redone here, for {candidates[index]}). "
                f"Traceback from the worker:\n{row.get('traceback')}"
            ) from None
        _relay_warnings(result, rows)
        names = list(self.scorers._scorers) if isinstance(self.scorers, _MultimetricScorer) else None
        out = [
            fold_result(row, f, multimetric_names=names, error_score=s.error_score, train=s.return_train_score)
            for row in rows
            for f in range(len(splits))
        ]
        if lines is not None:  # the lines no event brought (an embedded cluster, results from a store)
            n = len(splits)
            lines.finish([out[i * n:(i + 1) * n] for i in range(len(candidates))])
        return out

    def _reraise_locally(self, params: dict, splits: list) -> None:
        """A candidate's branch failed on the cluster: raise its own exception here, as
        scikit-learn would (the cluster sends only text), by redoing the candidate here fold by
        fold as scikit-learn's ``_fit_and_score`` does until it raises: the split (which fails
        whatever ``error_score`` is: a precomputed kernel that is not square), the fit (which
        raises with ``error_score='raise'``), the scoring (which raises with ``'raise'``, and
        for a multi-metric scorer always: unrequested metadata).  Returns if nothing raised."""
        from ._compat import _safe_split, _score

        s, X, y, routed = self.search, self.X, self.y, self.routed
        for train, test in splits:
            est = clone(s.estimator).set_params(**clone(params, safe=False))
            X_train, y_train = _safe_split(est, X, y, train)
            X_test, y_test = _safe_split(est, X, y, test, train)
            fit_params = _check_method_params(X, params=routed.estimator.fit, indices=train)
            try:
                est.fit(X_train, **fit_params) if y_train is None else est.fit(X_train, y_train, **fit_params)
            except Exception:  # re-raised under error_score="raise"; else this fold fails here as on the cluster
                if s.error_score == "raise":
                    raise
                continue
            score_params = _check_method_params(X, params=routed.scorer.score, indices=test)
            _score(est, X_test, y_test, self.scorers, score_params, s.error_score)

    def _fold_args(self, splits: list):
        """``(candidate, fold) -> X, y, metadata`` of that fit for the callback hooks, as
        callables (split here only if a hook asks; once per fold)."""
        from ._compat import _safe_split

        X, y, routed, base = self.X, self.y, self.routed, self.base

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


def _relay_warnings(result: Any, rows: list[dict]) -> None:
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


def _threads(client: Any) -> int | None:
    """The threads a run on ``client`` will have, when ``client`` is a connected ``Client``
    (``None``: an address or an embedded cluster; :func:`.exploration.build` assumes an
    embedded cluster's)."""
    nthreads = getattr(client, "nthreads", None)
    if client is None or isinstance(client, str) or not callable(nthreads):
        return None
    try:
        return max(1, sum(nthreads().values()))
    except (OSError, TimeoutError):  # the scheduler does not answer: the run itself will say so
        return None
