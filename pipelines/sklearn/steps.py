"""The steps a search runs on the workers: load, split a fold, fit a level, score, summarise.

A *prefix* value flows from level to level of one fold: the fold's targets and parameters,
the fitted steps so far, the training data transformed by them (``fit_transform``), the test
data (and, for train scores, the training data) passed through their ``transform`` (or the raw
data, for a scorer of the user's own), the fit and score seconds spent, and the error text if a
fit failed (later levels then pass it on without fitting, as scikit-learn scores a pipeline
whose fit failed with ``error_score``).  The last level returns what scikit-learn's
``_fit_and_score`` returns (``test_scores``, ``train_scores``, ``n_test_samples``,
``fit_time``, ``score_time``, ``fit_error``) and the warnings met on the way (``warnings``,
recorded by :func:`pipelines.sklearn.relay.caught`); :func:`summarize` flattens a candidate's
folds into table scalars (``split0_test_score``, ..., ``mean_test_score``, ``warnings``).

>>> summarize([{"test_scores": 0.5, "n_test_samples": 2, "fit_time": 0.1, "score_time": 0.0, "fit_error": None},
...            {"test_scores": 1.0, "n_test_samples": 2, "fit_time": 0.2, "score_time": 0.0, "fit_error": None}],
...           error_score=0.0)["mean_test_score"]
0.75
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np

from .config import applied
from .relay import caught, pack
from .verbose import send
from .tokens import Est, estimator_token, param_token, unwrap

__all__ = ["load_data", "split_fold", "split_folds", "LevelStep", "FoldsStep", "FinalConfig", "collect_folds",
           "summarize", "MeanTest", "FitFailed"]

PASSTHROUGH = (None, "passthrough")


class FitFailed(RuntimeError):
    """A candidate's fit failed on a worker with ``error_score='raise'`` (the text is its traceback)."""


def load_data(*, X: Any, y: Any, fit_params: dict, score_params: dict) -> dict:
    """The search's data, once per run (the source every fold splits)."""
    return {"X": X, "y": y, "fit_params": fit_params, "score_params": score_params}


def split_fold(data: dict, /, *, estimator: Est, train: Any, test: Any, config: dict | None = None,
               index: int = 0) -> dict:
    """One cross-validation fold, as scikit-learn splits it (pairwise kernels included): the
    starting prefix of every candidate on this fold.  ``config``: scikit-learn's configuration
    at ``fit`` (:mod:`.config`), which every later step of the fold runs under; ``index``: the
    fold's number (for the ``verbose`` lines)."""
    from ._compat import _check_method_params, _safe_split

    start = time.time()
    est, X, y = estimator.estimator, data["X"], data["y"]
    with applied(config), caught() as records:
        X_train, y_train = _safe_split(est, X, y, train)
        X_test, y_test = _safe_split(est, X, y, test, train)
        fold = {
            "X_train": X_train,
            "y_train": y_train,
            "X_test": X_test,
            "y_test": y_test,
            "fit_params": _check_method_params(X, params=data["fit_params"], indices=train),
            "score_params_train": _check_method_params(X, params=data["score_params"], indices=train),
            "score_params_test": _check_method_params(X, params=data["score_params"], indices=test),
        }
    return {"fold": fold, "steps": [], "Xt": X_train, "Xte": X_test, "Xtr": X_train, "fit_time": time.time() - start,
            "score_time": 0.0, "error": None, "warnings": records, "config": config, "index": index, "params": {}}


def split_folds(data: dict, /, *, estimator: Est, folds: tuple, config: dict | None = None) -> list:
    """A group of folds in one task: ``folds`` is ``((index, train, test), ...)``; the
    prefixes :func:`split_fold` gives for each, in order.  A level then fits all of them in one
    task (:class:`FoldsStep`): when a search has enough candidates to keep every thread busy,
    one task per candidate and fold costs more in scheduling than the tiny fits themselves."""
    return [split_fold(data, estimator=estimator, train=train, test=test, config=config, index=index)
            for index, train, test in folds]


def scores_transformed(scorer: Any) -> bool:
    """True when ``scorer`` only calls the estimator's prediction methods (or ``score``), so
    scoring the final step on the test data transformed by the fitted prefix gives exactly what
    scoring the whole pipeline on the raw data gives (a ``Pipeline`` does just that): the
    scorers scikit-learn builds from ``scoring=None``, a name, ``make_scorer``, or a list/dict
    of those.  A user's own callable gets the assembled pipeline and the raw data."""
    from ._compat import _MultimetricScorer, _PassthroughScorer, _Scorer

    if isinstance(scorer, _MultimetricScorer):
        return all(scores_transformed(s) for s in scorer._scorers.values())
    return type(scorer) in (_Scorer, _PassthroughScorer)


class FinalConfig:
    """What the last level needs to score: the scorer(s), ``return_train_score``,
    ``error_score`` and the estimator the fitted steps are assembled into."""

    __slots__ = ("scorer", "return_train_score", "error_score", "template", "report")

    def __init__(self, scorer: Any, return_train_score: bool, error_score: Any, template: Any,
                 report: str | None = None):
        self.scorer = scorer
        self.return_train_score = bool(return_train_score)
        self.error_score = error_score
        self.template = template
        self.report = report  # the Dask event topic of the verbose lines (not part of the token)

    def __dask_tokenize__(self) -> Any:
        from dask.tokenize import tokenize

        return ("FinalConfig", tokenize(self.scorer), self.return_train_score, repr(self.error_score),
                estimator_token(self.template))


class LevelStep:
    """Fit one level of a candidate (a pipeline step, or the whole estimator) on a prefix.

    ``level``: the step name; ``base``: the step's estimator in the search's estimator;
    ``slot``: True when ``level`` is a pipeline step (parameters are named ``step`` and
    ``step__param``), False when the level is the whole estimator (parameters as given);
    ``final``: a :class:`FinalConfig` on the last level (fit, then score), else ``None``.
    ``transformed``: carry the test data (and the training data, for ``train_scores``) through
    each fitted step, drop the raw data, and score the final step on them (see
    :func:`scores_transformed`); else carry the raw data and score the assembled pipeline.
    Its ``__name__`` is the label the table and dashboard show.
    """

    def __init__(self, level: str, base: Any, *, slot: bool, final: FinalConfig | None, label: str,
                 transformed: bool = False, train_scores: bool = False):
        self.level = level
        self.base = base
        self.slot = slot
        self.final = final
        self.transformed = bool(transformed and slot)
        self.train_scores = bool(train_scores)
        self.__name__ = label

    def __dask_tokenize__(self) -> Any:
        final = None if self.final is None else self.final.__dask_tokenize__()
        return ("LevelStep", self.level, param_token(self.base), self.slot, final, self.__name__, self.transformed,
                self.train_scores)

    def __repr__(self) -> str:
        return f"LevelStep({self.level!r}, {self.__name__})"

    # ---- building the estimator of one alternative ---------------------------------------
    def configure(self, params: dict) -> Any:
        """A fresh estimator for this level with ``params`` set (values cloned, as scikit-learn does)."""
        from sklearn.base import clone

        params = unwrap(params)
        if not self.slot:
            return clone(self.base).set_params(**clone(params, safe=False))
        est = params.pop(self.level, self.base)
        if isinstance(est, str) or est is None:
            if params:
                raise ValueError(f"step {self.level!r} is {est!r} and cannot take parameters {sorted(params)}")
            return est
        sub = {k[len(self.level) + 2:]: v for k, v in params.items()}
        if est is self.base or not sub:
            est = clone(est)
        else:
            est = clone(est, safe=False)
        return est.set_params(**clone(sub, safe=False)) if sub else est

    def _step_fit_params(self, fit_params: dict) -> dict:
        if not self.slot:
            return fit_params
        prefix = self.level + "__"
        return {k[len(prefix):]: v for k, v in fit_params.items() if k.startswith(prefix)}

    # ---- running ------------------------------------------------------------------------
    def __call__(self, prev: dict, /, **params: Any) -> dict:
        """The next prefix (or, on the last level, the fold's result), with the warnings met
        so far on this candidate's path and fold under ``warnings`` (:mod:`.relay`)."""
        with applied(prev.get("config")), caught() as records:
            out = self._run(prev, params)
        out = {**out, "warnings": list(prev.get("warnings", ())) + records}  # prev may be shared: not mutated
        candidate = {**prev.get("params", {}), **unwrap(params)}
        if self.final is None:
            out["params"] = candidate
        elif self.final.report is not None:  # verbose >= 2: the caller prints this fit's line
            send(self.final.report, param_token(candidate), prev.get("index", 0), out)
        return out

    def _run(self, prev: dict, params: dict) -> dict:
        if prev["error"] is not None:
            return prev if self.final is None else self._scored(prev, None, prev["fit_time"], prev["error"])
        est = self.configure(params)
        fold = prev["fold"]
        fp = self._step_fit_params(fold["fit_params"])
        y = fold["y_train"]
        start = time.time()
        try:
            if self.final is not None:
                if est not in PASSTHROUGH:
                    est.fit(prev["Xt"], **fp) if y is None else est.fit(prev["Xt"], y, **fp)
                Xt = None
            elif est in PASSTHROUGH:
                Xt = prev["Xt"]
            elif hasattr(est, "fit_transform"):
                Xt = est.fit_transform(prev["Xt"], y, **fp)
            else:
                Xt = est.fit(prev["Xt"], y, **fp).transform(prev["Xt"])
        except Exception:  # recorded (the traceback): a failing estimator is this candidate's result, as in sklearn
            error = traceback.format_exc()
            fit_time = prev["fit_time"] + time.time() - start
            if self.final is not None:
                return self._scored(prev, None, fit_time, error)
            return {**prev, "fit_time": fit_time, "error": error}
        fit_time = prev["fit_time"] + time.time() - start
        steps = prev["steps"] + [(self.level, est)]
        if self.final is None:
            out = {**prev, "steps": steps, "Xt": Xt, "fit_time": fit_time}
            if self.transformed:
                start = time.time()
                out["fold"] = {k: v for k, v in fold.items() if k not in ("X_train", "X_test")}
                if est not in PASSTHROUGH:
                    out["Xte"] = est.transform(prev["Xte"])
                    out["score_time"] = prev["score_time"] + time.time() - start
                    out["Xtr"] = est.transform(prev["Xtr"]) if self.train_scores else None
            return out
        if self.transformed:
            return self._scored(prev, est, fit_time, None, prev["Xte"], prev["Xtr"])
        model = est
        if self.slot:
            from sklearn.base import clone

            model = clone(self.final.template)
            model.steps = steps
        return self._scored(prev, model, fit_time, None, fold["X_test"], fold["X_train"])

    def _scored(self, prev: dict, model: Any, fit_time: float, error: str | None, X_test: Any = None,
                X_train: Any = None) -> dict:
        """What scikit-learn's ``_fit_and_score`` returns for this candidate and fold."""
        from ._compat import _MultimetricScorer, _num_samples, _score

        cfg, fold = self.final, prev["fold"]
        out: dict[str, Any] = {"fit_error": error}
        if error is not None:
            score_time = 0.0
            if isinstance(cfg.scorer, _MultimetricScorer):
                test = {name: cfg.error_score for name in cfg.scorer._scorers}
            else:
                test = cfg.error_score
            train = test.copy() if isinstance(test, dict) else test
        else:
            start = time.time()
            test = _score(model, X_test, fold["y_test"], cfg.scorer, fold["score_params_test"], cfg.error_score)
            score_time = prev["score_time"] + time.time() - start  # with the test transforms of the prefix
            if cfg.return_train_score:
                train = _score(model, X_train, fold["y_train"], cfg.scorer, fold["score_params_train"], cfg.error_score)
        out["test_scores"] = test
        if cfg.return_train_score:
            out["train_scores"] = train
        out["n_test_samples"] = _num_samples(prev["Xte"])  # transforms keep the rows
        out["fit_time"] = fit_time
        out["score_time"] = score_time
        return out


class FoldsStep:
    """A :class:`LevelStep` on a group of folds: the step on each fold's prefix, in fold order
    (one task instead of one per fold).  ``summary=True``: on the last level of a search whose
    folds form one group, return :func:`summarize`'s table scalars of the folds (the candidate's
    row, with the search's ``error_score``) instead of the list, so that summarising costs no
    task of its own.

    >>> FoldsStep(LevelStep("clf", None, slot=True, final=None, label="SVC")).__name__
    'SVC'
    """

    def __init__(self, step: LevelStep, *, summary: bool = False, error_score: Any = None):
        self.step = step
        self.summary = bool(summary)
        self.error_score = error_score
        self.__name__ = step.__name__

    def __dask_tokenize__(self) -> Any:
        return ("FoldsStep", self.step.__dask_tokenize__(), self.summary, repr(self.error_score))

    def __repr__(self) -> str:
        return f"FoldsStep({self.step!r})"

    def __call__(self, prevs: list, /, **params: Any) -> Any:
        out = [self.step(prev, **params) for prev in prevs]
        return summarize(out, error_score=self.error_score) if self.summary else out


def collect_folds(first: list, second: list) -> list:
    """Join two groups of a candidate's fold results, in fold order (groups are joined two at a time).

    >>> collect_folds([{"fold": 0}], [{"fold": 1}, {"fold": 2}])
    [{'fold': 0}, {'fold': 1}, {'fold': 2}]
    """
    return [*first, *second]


def _short(error: str) -> str:
    r"""The exception part of a traceback (``ValueError: ...``, after its last frame line), at
    most 200 characters (a table scalar).

    >>> _short('Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n [[1 2]]')
    'ValueError: bad [[1 2]]'
    """
    lines = error.strip().splitlines()
    i = max((n for n, line in enumerate(lines) if line.startswith("Traceback")), default=-1) + 1
    while 0 < i < len(lines) and lines[i].startswith("  "):  # the frames of the last traceback
        i += 1
    text = " ".join(line.strip() for line in lines[max(i, 0):] if line.strip()) or error.strip()
    return text if len(text) <= 200 else text[:197] + "..."


def _number(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "shape", None) == ():
        v = v.item()
    return v


def summarize(folds: list, /, *, error_score: Any) -> dict:
    """One candidate's folds as table scalars: ``split<i>_test_<metric>``,
    ``split<i>_train_<metric>``, ``split<i>_fit_time``, ``split<i>_score_time``,
    ``split<i>_n_test_samples``, ``split<i>_fit_error`` (the error's last line, failed folds
    only), ``test_metrics`` (the metric names when the scorer returned a dict, joined by
    ``|``) and ``mean_test_<metric>`` (what the choose ranks by).

    With ``error_score='raise'`` a failed fit raises :class:`FitFailed` with its traceback,
    so the branch shows as failed.
    """
    out: dict[str, Any] = {}
    means: dict[str, list] = {}
    metrics = ""
    out.update(pack([list(fold.get("warnings", ())) for fold in folds]))
    for i, fold in enumerate(folds):
        if fold["fit_error"] is not None:
            if error_score == "raise":
                raise FitFailed(f"fit failed on fold {i}:\n{fold['fit_error']}")
            out[f"split{i}_fit_error"] = _short(fold["fit_error"])
        for kind in ("test", "train"):
            scores = fold.get(f"{kind}_scores")
            if scores is None:
                continue
            if isinstance(scores, dict) and fold["fit_error"] is None:
                metrics = "|".join(scores)
            scores = scores if isinstance(scores, dict) else {"score": scores}
            for name, value in scores.items():
                value = _number(value)
                out[f"split{i}_{kind}_{name}"] = value
                if kind == "test":
                    means.setdefault(name, []).append(value)
        out[f"split{i}_fit_time"] = fold["fit_time"]
        out[f"split{i}_score_time"] = fold["score_time"]
        out[f"split{i}_n_test_samples"] = fold["n_test_samples"]
    out["test_metrics"] = metrics  # the names a scorer returning a dict gave ("" for one number)
    for name, values in means.items():
        try:  # as scikit-learn averages (np.average over float64), so the two agree to the bit
            out[f"mean_test_{name}"] = float(np.average(np.asarray(values, dtype=np.float64)))
        except (TypeError, ValueError):
            out[f"mean_test_{name}"] = float("nan")
    return out


class MeanTest:
    """The choose metric: a candidate's ``mean_test_<metric>`` (``metric=None``: ``score``,
    or the first metric a callable scorer returned)."""

    def __init__(self, metric: str | None):
        self.metric = metric
        self.__name__ = f"mean_test_{metric or 'score'}"

    def __dask_tokenize__(self) -> Any:
        return ("MeanTest", self.metric)

    def __call__(self, summary: dict) -> float:
        key = f"mean_test_{self.metric or 'score'}"
        if key not in summary and self.metric is None:
            key = next((k for k in summary if k.startswith("mean_test_")), key)
        return float(summary.get(key, float("nan")))
