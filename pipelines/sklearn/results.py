"""From a run's table back to scikit-learn's per-(candidate, fold) results.

``fold_results`` turns each branch's table scalars (``split<i>_test_<metric>``, ...) into
the list of dicts scikit-learn's ``_fit_and_score`` returns, in scikit-learn's order
(candidate-major, fold-minor), which the search hands to scikit-learn's own
``_format_results`` to make ``cv_results_``.

>>> row = {"split0_test_score": 0.5, "split0_fit_time": 0.1, "split0_score_time": 0.01,
...        "split0_n_test_samples": 4, "test_metrics": ""}
>>> fold_result(row, 0, multimetric_names=None, error_score=0.0, train=False)
{'fit_error': None, 'test_scores': 0.5, 'n_test_samples': 4, 'fit_time': 0.1, 'score_time': 0.01}
>>> row = {"split0_test_score": 0.0, "split0_fit_error": "ValueError: bad", "split0_fit_time": 0.1,
...        "split0_score_time": 0.0, "split0_n_test_samples": 4, "test_metrics": ""}
>>> fold_result(row, 0, multimetric_names=["a", "b"], error_score=0.0, train=False)["test_scores"]
{'a': 0.0, 'b': 0.0}
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["fold_result", "rows_by_candidate", "Failed"]


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _scores(row: dict, fold: int, kind: str, names: list[str] | None) -> Any:
    if names is None:
        return row[f"split{fold}_{kind}_score"]
    return {n: row[f"split{fold}_{kind}_{n}"] for n in names}


def fold_result(row: dict, fold: int, *, multimetric_names: list[str] | None, error_score: Any, train: bool) -> dict:
    """What scikit-learn's ``_fit_and_score`` returned for this branch's ``fold``.

    ``multimetric_names``: the scorer names of a multi-metric ``scoring`` (``None`` for one
    scorer, or a callable: then the names the callable returned, from ``test_metrics``).
    A failed fit gets ``error_score`` as scikit-learn gives it (a dict per metric for a
    multi-metric scorer, else the number), and its ``fit_error`` is the error's last line.
    """
    error = row.get(f"split{fold}_fit_error")
    error = error if isinstance(error, str) else None
    out: dict[str, Any] = {"fit_error": error}
    if error is not None:
        test: Any = {n: error_score for n in multimetric_names} if multimetric_names else error_score
        out["test_scores"] = test
        if train:
            out["train_scores"] = test.copy() if isinstance(test, dict) else test
    else:
        names = multimetric_names
        if names is None and isinstance(row.get("test_metrics"), str) and row["test_metrics"]:
            names = row["test_metrics"].split("|")  # a callable scorer that returned a dict
        out["test_scores"] = _scores(row, fold, "test", names)
        if train:
            out["train_scores"] = _scores(row, fold, "train", names)
    out["n_test_samples"] = int(row[f"split{fold}_n_test_samples"])
    out["fit_time"] = float(row[f"split{fold}_fit_time"])
    out["score_time"] = float(row[f"split{fold}_score_time"])
    return out


class Failed(Exception):
    """Branches of the run that failed in Quiver (``rows``: their table rows)."""

    def __init__(self, rows: list[tuple[int, dict]]):
        self.rows = rows
        first = rows[0][1]
        super().__init__(f"{len(rows)} candidate(s) failed; the first with {first.get('error')}")


def rows_by_candidate(table: Any, branches: list, token_of_branch, candidate_tokens: list[str]) -> list[dict]:
    """The table row (as a dict) of each candidate, in candidate order.

    ``branches``: the compiled branches in table order; ``token_of_branch(branch)``: the
    candidate token a branch stands for.  Raises :class:`Failed` listing the candidates whose
    branch failed.
    """
    records = table.to_dict("records")
    by_token = {token_of_branch(b): rec for b, rec in zip(branches, records)}
    rows = [by_token[t] for t in candidate_tokens]
    failed = [(i, r) for i, r in enumerate(rows) if r.get("status") != "ok"]
    if failed:
        raise Failed(failed)
    return rows
