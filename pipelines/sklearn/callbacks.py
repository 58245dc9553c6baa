"""scikit-learn's fit callbacks (``search.set_callbacks(...)``, ``sklearn.callback``), called
in the caller on the task tree scikit-learn's own searches build.

scikit-learn >= 1.9 calls, for a search: ``setup``; ``on_fit_task_begin`` on the root task;
on a ``search`` task; on one ``candidate-split-evaluation`` task per (candidate, fold) (with
that fold's training data); ``on_fit_task_end`` on each in reverse; then the same on a
``refit-with-best-params`` task; ``teardown`` (the latter by ``_fit_context``).  The drop-in
builds the same tree and calls the same hooks, the same number of times, here in the caller:
the (candidate, fold) tasks ran on the workers, so their begin and end hooks are called when
the run is over, in scikit-learn's order, with the fold's training data split here only if a
hook asks for it.  Callbacks that scikit-learn propagates into the fitted estimators
(``AutoPropagatedCallback``, e.g. ``ProgressBar``) are not sent to the workers: their hooks on
an estimator's own inner tasks (iterations) are not called.

With a scikit-learn without callbacks every method does nothing.

>>> from sklearn.linear_model import Ridge
>>> from pipelines.sklearn import GridSearchCV
>>> tree = Tree(GridSearchCV(Ridge(), {"alpha": [1.0]}), refit=False)
>>> tree.begin(X=None, y=None, metadata=None); tree.evaluated([], lambda i, f: {}); tree.end()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Tree"]


class Tree:
    """The callback task tree of one ``fit`` of ``search``."""

    def __init__(self, search: Any, *, refit: Any):
        self.search = search
        self.enabled = hasattr(search, "_init_callback_context")
        self.refit = refit
        self.root: Any = None
        self.kwargs: dict = {}

    def begin(self, *, X: Any, y: Any, metadata: dict | None) -> None:
        """The root task begins (``setup`` of the search's callbacks first)."""
        if not self.enabled:
            return
        self.kwargs = {"X": X, "y": y, "metadata": metadata}
        self.root = self.search._init_callback_context(max_subtasks=1 + (self.refit is not False))
        self.root.call_on_fit_task_begin(estimator=self.search, **self.kwargs)

    def evaluated(self, pairs: list[tuple[int, int]], fold_args: Callable[[int, int], dict]) -> None:
        """The ``search`` task and its (candidate, fold) tasks, all ended: ``pairs`` in
        scikit-learn's order; ``fold_args(candidate, fold)``: the hooks' ``X``, ``y``,
        ``metadata`` for that fit (callables: evaluated only if a hook asks)."""
        if self.root is None:
            return
        search_ctx = self.root.subcontext(task_name="search", max_subtasks=len(pairs), sequential_subtasks=False)
        search_ctx.call_on_fit_task_begin(estimator=self.search)
        contexts = [search_ctx.subcontext(task_name="candidate-split-evaluation", task_id=i) for i in range(len(pairs))]
        for ctx, (c, f) in zip(contexts, pairs):
            args = fold_args(c, f)
            ctx.call_on_fit_task_begin(estimator=self.search, **args)
            ctx.call_on_fit_task_end(estimator=self.search, **args)
        search_ctx.call_on_fit_task_end(estimator=self.search)

    def refit_context(self, best_estimator: Any):
        """A context manager around the refit: its task begins and ends, with the search's
        auto-propagated callbacks given to ``best_estimator`` (it is fitted here)."""
        import contextlib

        if self.root is None:
            return contextlib.nullcontext()
        sub = self.root.subcontext(task_name="refit-with-best-params")
        search, kwargs = self.search, self.kwargs

        @contextlib.contextmanager
        def refit():
            with sub.propagate_callback_context(best_estimator):
                sub.call_on_fit_task_begin(estimator=search, **kwargs)
                yield
            sub.call_on_fit_task_end(estimator=search, **kwargs)

        return refit()

    def end(self) -> None:
        """The root task ends (``teardown`` is ``_fit_context``'s)."""
        if self.root is not None:
            self.root.call_on_fit_task_end(estimator=self.search, **self.kwargs)
