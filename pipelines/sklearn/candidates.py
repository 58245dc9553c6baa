"""Checks and scorers shared by the search classes and ``from_sklearn``, before anything runs.

>>> from sklearn.svm import SVC
>>> check_candidates(SVC(), [{"C": 1}, {"gamma": 0.1}])
>>> check_candidates(SVC(), [{"D": 1}])
Traceback (most recent call last):
    ...
ValueError: Invalid parameter 'D' for estimator SVC(). Valid parameters are: ...
"""

from __future__ import annotations

from typing import Any

from sklearn import model_selection as _ms
from sklearn.base import clone

__all__ = ["check_candidates", "scorers_for", "NO_FITS"]

#: scikit-learn's error for a search with no candidates or no folds, word for word
NO_FITS = "No fits were performed. Was the CV iterator empty? Were there no candidates?"


def check_candidates(estimator: Any, candidates: list[dict]) -> None:
    """Refuse a search with no candidates, or a parameter the estimator does not have,
    before anything runs (scikit-learn's own ``set_params`` message names the parameter)."""
    if not candidates:
        raise ValueError(NO_FITS)
    seen: set[str] = set()
    for params in candidates:
        keys = repr(sorted(params))
        if keys in seen:  # the same parameter names were already accepted
            continue
        clone(estimator).set_params(**clone(params, safe=False))
        seen.add(keys)


def scorers_for(estimator: Any, scoring: Any, error_score: Any) -> Any:
    """The scorer(s) for ``scoring`` as scikit-learn's searches build them."""
    search = _ms.GridSearchCV(estimator, {}, scoring=scoring, error_score=error_score, refit=False)
    return search._get_scorers()[0]
