"""The scikit-learn internals this package reuses, imported in one place.

The search classes subclass scikit-learn's own, and hand their per-fold results to
scikit-learn's own ``_format_results``, ``_warn_or_raise_about_fit_failures`` and
``_insert_error_scores``, so ``cv_results_``, warnings and errors are scikit-learn's,
not a copy of them.  Tested with scikit-learn 1.9.
"""

from __future__ import annotations

try:
    from sklearn.base import _fit_context
    from sklearn.model_selection._validation import (
        _insert_error_scores,
        _score,
        _warn_or_raise_about_fit_failures,
    )
    from sklearn.utils._param_validation import HasMethods  # noqa: F401  (re-exported)
    from sklearn.utils.metaestimators import _safe_split
    from sklearn.utils.validation import _check_method_params, _num_samples
    from sklearn.metrics._scorer import _MultimetricScorer, _PassthroughScorer, _Scorer
except ImportError as exc:  # pragma: no cover - depends on the installed version
    raise ImportError(
        f"pipelines.sklearn needs scikit-learn >= 1.4 (tested with 1.9): {exc}. "
        "Upgrade it: pip install -U scikit-learn"
    ) from exc

__all__ = [
    "_fit_context",
    "_insert_error_scores",
    "_score",
    "_warn_or_raise_about_fit_failures",
    "_safe_split",
    "_check_method_params",
    "_num_samples",
    "_MultimetricScorer",
    "_PassthroughScorer",
    "_Scorer",
]
