"""scikit-learn's fit callbacks (``search.set_callbacks(...)``, ``sklearn.callback``) on the
task tree scikit-learn's own searches build.

scikit-learn >= 1.9 calls, for a search: ``setup``; ``on_fit_task_begin`` on the root task;
on the ``search`` task (and, halving, on each ``halving-iteration``) that its own
``_run_search`` opens; on one ``candidate-split-evaluation`` task per (candidate, fold), with
that fold's training data; ``on_fit_task_end`` on each; the same on a
``refit-with-best-params`` task; ``teardown`` (by ``_fit_context``).  The drop-in's ``fit``
opens the root and refit tasks as scikit-learn's ``fit`` does and runs scikit-learn's own
``_run_search``; :func:`evaluation_hooks` calls the (candidate, fold) tasks' hooks, here in
the caller once the run is over (the fits ran on the workers), in scikit-learn's order, with
the fold's training data split here only if a hook asks for it.  Callbacks scikit-learn
propagates into the fitted estimators (``AutoPropagatedCallback``, e.g. ``ProgressBar``) are
not sent to the workers: their hooks on an estimator's own inner tasks are not called.

>>> evaluation_hooks(None, None, [(0, 0)], lambda c, f: {})   # no callback context: nothing
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["evaluation_hooks", "root_context", "refit_hooks"]


def root_context(search: Any, *, X: Any, y: Any, metadata: dict | None) -> Any:
    """The root task, begun (``setup`` first), as scikit-learn's ``fit`` opens it; ``None``
    with a scikit-learn without callbacks."""
    if not hasattr(search, "_init_callback_context"):
        return None
    root = search._init_callback_context(max_subtasks=1 + (search.refit is not False))
    return root.call_on_fit_task_begin(estimator=search, X=X, y=y, metadata=metadata)


def evaluation_hooks(callback_ctx: Any, search: Any, pairs: list[tuple[int, int]],
                     fold_args: Callable[[int, int], dict]) -> None:
    """Begin and end one ``candidate-split-evaluation`` task under ``callback_ctx`` per
    (candidate, fold) of ``pairs`` (scikit-learn's order); ``fold_args(candidate, fold)``:
    the hooks' ``X``, ``y``, ``metadata`` (callables, evaluated only if a hook asks)."""
    if callback_ctx is None:
        return
    contexts = [callback_ctx.subcontext(task_name="candidate-split-evaluation", task_id=i) for i in range(len(pairs))]
    for ctx, (c, f) in zip(contexts, pairs):
        args = fold_args(c, f)
        ctx.call_on_fit_task_begin(estimator=search, **args)
        ctx.call_on_fit_task_end(estimator=search, **args)


@contextlib.contextmanager
def refit_hooks(root: Any, search: Any, best_estimator: Any, **kwargs: Any) -> Iterator[None]:
    """Around the refit: its task begins and ends, the search's auto-propagated callbacks
    given to ``best_estimator`` (fitted here, in the caller)."""
    if root is None:
        yield
        return
    sub = root.subcontext(task_name="refit-with-best-params")
    with sub.propagate_callback_context(best_estimator):
        sub.call_on_fit_task_begin(estimator=search, **kwargs)
        yield
    sub.call_on_fit_task_end(estimator=search, **kwargs)
