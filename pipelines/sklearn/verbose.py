"""``verbose``: scikit-learn's progress lines, printed in the caller as the workers' fits finish.

At ``verbose >= 1`` a search prints ``Fitting 3 folds for each of 4 candidates, totalling 12
fits``; at ``verbose >= 2`` one ``[CV] END ...`` line per (candidate, fold) fit, with the
split number at ``>= 3`` (and the candidate number, and a ``START`` line, at ``>= 10``), as
scikit-learn's ``_fit_and_score`` prints them (the ``START`` line comes with the ``END`` one).  Each final step on a worker sends what the line needs as a
Dask event (:func:`send`); :class:`Lines` prints them as they arrive when the search has a
``Client`` (or a scheduler address) to listen on, and at the end of the run prints the lines
that did not arrive (from the run's results: an embedded cluster, or results loaded from a
store).

>>> end_line({"C": 1.0, "kernel": "rbf"}, verbose=3, fold=0, n_splits=3, candidate=1, n_candidates=4,
...          test=0.9, train=None, total_time=0.01)
'[CV 1/3] END .....................C=1.0, kernel=rbf;, score=0.900 total time=   0.0s'
"""

from __future__ import annotations

import logging

import threading
from typing import Any

__all__ = ["end_line", "start_line", "send", "Lines"]

logger = logging.getLogger(__name__)


def start_line(n_splits: int, n_candidates: int) -> str:
    """scikit-learn's line at ``verbose >= 1``, before the fits."""
    return f"Fitting {n_splits} folds for each of {n_candidates} candidates, totalling {n_splits * n_candidates} fits"


def end_line(params: dict, *, verbose: int, fold: int, n_splits: int, candidate: int, n_candidates: int,
             test: Any, train: Any, total_time: float) -> str:
    """The ``[CV] END`` line scikit-learn prints for one fit (``train``: ``None`` without train scores)."""
    from joblib import logger

    progress = ""
    if verbose > 2:
        progress = f" {fold + 1}/{n_splits}"
        if verbose > 9:
            progress += f"; {candidate + 1}/{n_candidates}"
    params_msg = ", ".join(f"{k}={params[k]}" for k in sorted(params))
    head = f"[CV{progress}] END "
    msg = params_msg + (";" if params_msg else "")
    if verbose > 2:
        if isinstance(test, dict):
            for name in sorted(test):
                msg += f" {name}: ("
                if train is not None:
                    msg += f"train={train[name]:.3f}, "
                msg += f"test={test[name]:.3f})"
        else:
            msg += ", score="
            msg += f"(train={train:.3f}, test={test:.3f})" if train is not None else f"{test:.3f}"
    msg += f" total time={logger.short_format_time(total_time)}"
    return head + "." * (80 - len(head) - len(msg)) + msg


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def send(topic: str, candidate: str, fold: int, result: dict) -> None:
    """On a worker: report one finished fit (``result``: what ``_fit_and_score`` returns) on
    ``topic``.  Outside a worker, or if the event cannot be sent, nothing happens."""
    from gpu.worker import current_worker  # the one answer to "am I in a task?"

    worker = current_worker()
    if worker is None:
        return
    msg = {"candidate": candidate, "fold": int(fold), "test": _plain(result.get("test_scores")),
           "train": _plain(result.get("train_scores")),
           "time": float(result.get("fit_time", 0.0)) + float(result.get("score_time", 0.0))}
    try:
        worker.log_event(topic, msg)
    except Exception as exc:  # progress lines must never fail a fit: the line is dropped, the reason logged
        logger.debug("verbose line not sent: %s", exc)


class Lines:
    """Prints a search's ``[CV] END`` lines: live from a client's events, the rest at the end.

    ``candidates``: the parameter dicts; ``tokens``: their tokens (what the workers send).
    """

    def __init__(self, topic: str, verbose: int, candidates: list[dict], tokens: list[str], n_splits: int,
                 train_scores: bool):
        self.topic = topic
        self.verbose = verbose
        self.candidates = candidates
        self.index = {t: i for i, t in enumerate(tokens)}
        self.n_splits = n_splits
        self.train_scores = train_scores
        self.printed: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.client: Any = None

    def _print(self, candidate: int, fold: int, test: Any, train: Any, total_time: float) -> None:
        with self.lock:
            if (candidate, fold) in self.printed:
                return
            self.printed.add((candidate, fold))
            if self.verbose > 9:  # scikit-learn's START line (here printed when the fit has ended)
                head = f"[CV {fold + 1}/{self.n_splits}; {candidate + 1}/{len(self.candidates)}] START "
                params = self.candidates[candidate]
                head += ", ".join(f"{k}={params[k]}" for k in sorted(params))
                print(head + "." * (80 - len(head)), flush=True)
            print(end_line(self.candidates[candidate], verbose=self.verbose, fold=fold, n_splits=self.n_splits,
                           candidate=candidate, n_candidates=len(self.candidates), test=test,
                           train=train if self.train_scores else None, total_time=total_time), flush=True)

    def _handle(self, event: Any) -> None:
        msg = event[1] if isinstance(event, tuple) else event
        i = self.index.get(msg.get("candidate"))
        if i is not None:
            self._print(i, msg["fold"], msg["test"], msg["train"], msg["time"])

    def listen(self, client: Any) -> None:
        """Print each fit's line as its event arrives on ``client`` (a ``distributed.Client``)."""
        try:
            client.subscribe_topic(self.topic, self._handle)
        except Exception as exc:  # pragma: no cover - an old distributed: lines come at the end
            logger.debug("no live verbose lines: %s", exc)
            return
        self.client = client

    def stop(self) -> None:
        """Stop listening (events still on their way are dropped: :meth:`finish` prints them)."""
        if self.client is not None:
            client, self.client = self.client, None
            try:
                client.unsubscribe_topic(self.topic)
            except Exception as exc:  # pragma: no cover - a closed client: nothing left to stop
                logger.debug("unsubscribing the verbose lines failed: %s", exc)

    def finish(self, folds: list[list[dict]]) -> None:
        """Stop listening; print the lines not printed yet, from each candidate's fold results."""
        self.stop()
        for i, per_fold in enumerate(folds):
            for f, out in enumerate(per_fold):
                self._print(i, f, out["test_scores"], out.get("train_scores"), out["fit_time"] + out["score_time"])
