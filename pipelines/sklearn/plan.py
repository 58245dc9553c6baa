"""Which explores a search becomes: one per pipeline step when the candidates allow it.

Pure decisions on literal inputs (no cluster, no fitting).  A candidate is a dict of
scikit-learn parameter names (``"pca__n_components"``, ``"clf"``, ...).  When the estimator is
a ``Pipeline`` and the candidates are exactly the Cartesian product of their per-step parts
(every single-dict ``param_grid`` is), the search becomes one explore per pipeline step, named
after the step, so a prefix shared by many candidates is one task per fold.  Otherwise (a list
of grids, parameters of several steps sampled together, a pipeline-level parameter) it is one
explore named ``"estimator"`` over whole candidates: identical candidates still share their tasks.

>>> steps = ["scale", "pca", "clf"]
>>> grid = [{"pca__n_components": n, "clf__C": c} for n in (4, 8) for c in (1, 10, 100)]
>>> plan = plan_levels(steps, grid, token=repr)
>>> plan.names, [len(a) for a in plan.alternatives]
(('scale', 'pca', 'clf'), [1, 2, 3])
>>> plan_levels(steps, grid[:5], token=repr).names      # not a product: whole candidates
('estimator',)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Levels", "plan_levels", "step_of", "fold_groups", "SINGLE"]

#: the explore name of a search that is not split by pipeline step
SINGLE = "estimator"


@dataclass(frozen=True)
class Levels:
    """``names``: explore names in order; ``alternatives``: per explore, the distinct parameter
    dicts in first-seen order; ``split``: True when the explores are pipeline steps."""

    names: tuple[str, ...]
    alternatives: tuple[tuple[dict, ...], ...]
    split: bool

    def parts(self, candidate: dict) -> list[dict]:
        """``candidate`` cut into one dict per explore."""
        if not self.split:
            return [dict(candidate)]
        out: list[dict] = [{} for _ in self.names]
        for k, v in candidate.items():
            out[self.names.index(step_of(k, self.names))][k] = v
        return out


def step_of(param: str, step_names: Sequence[str]) -> str | None:
    """The pipeline step a parameter belongs to (``None``: a parameter of the pipeline itself).

    >>> step_of("clf__C", ["pca", "clf"]), step_of("clf", ["pca", "clf"]), step_of("memory", ["clf"])
    ('clf', 'clf', None)
    """
    head = param.split("__", 1)[0]
    return head if head in step_names else None


def _distinct(dicts: list[dict], token: Callable[[Any], str]) -> tuple[tuple[dict, ...], set[str]]:
    seen: dict[str, dict] = {}
    for d in dicts:
        seen.setdefault(token(d), d)
    return tuple(seen.values()), set(seen)


def plan_levels(step_names: Sequence[str] | None, candidates: Sequence[dict], token: Callable[[Any], str]) -> Levels:
    """Decide the explores for ``candidates`` (``step_names``: the pipeline's, or ``None``).

    ``token`` maps a parameter dict to a string equal for equal dicts (order of keys aside).

    >>> plan_levels(None, [{"C": 1}, {"C": 1}, {"C": 2}], token=lambda d: repr(sorted(d.items()))).alternatives
    (({'C': 1}, {'C': 2}),)
    """
    if not candidates:
        raise ValueError("the search has no candidates: give a non-empty param_grid / param_distributions")
    whole, whole_tokens = _distinct(list(candidates), token)
    single = Levels((SINGLE,), (whole,), False)
    if not step_names or SINGLE in step_names:
        return single
    names = tuple(step_names)
    if any(step_of(k, names) is None for c in candidates for k in c):
        return single  # a parameter of the pipeline itself (memory, verbose, steps, ...) changes every step
    probe = Levels(names, (), True)
    per_level: list[list[dict]] = [[] for _ in names]
    for c in candidates:
        for i, part in enumerate(probe.parts(c)):
            per_level[i].append(part)
    alternatives = tuple(_distinct(parts, token)[0] for parts in per_level)
    if math.prod(len(a) for a in alternatives) != len(whole_tokens):
        return single  # not the Cartesian product of the per-step parts
    return Levels(names, alternatives, True)


#: tasks wanted per thread on a search's last level: enough for the threads to stay busy while
#: the candidates' fit times differ (scikit-learn's joblib dispatches ``2 * n_jobs`` ahead)
TASKS_PER_THREAD = 4


def fold_groups(candidates: int, n_splits: int, threads: int) -> tuple[tuple[int, ...], ...]:
    """Cut the folds ``0 .. n_splits-1`` into the fewest consecutive groups that still give
    the last level at least ``TASKS_PER_THREAD`` tasks per thread (a group of folds is one task
    per candidate): many candidates, one group (every fold of a candidate in one task); few
    candidates, one group per fold (the folds run in parallel).

    >>> fold_groups(36, 5, threads=2)     # 36 tasks already keep 2 threads busy
    ((0, 1, 2, 3, 4),)
    >>> fold_groups(1, 5, threads=2)      # one candidate: every fold its own task
    ((0,), (1,), (2,), (3,), (4,))
    >>> fold_groups(3, 5, threads=2)      # 8 tasks wanted of 3 candidates: 3 groups
    ((0, 1), (2, 3), (4,))
    """
    if n_splits < 1:
        return ()
    wanted = TASKS_PER_THREAD * max(1, threads)
    groups = max(1, min(n_splits, math.ceil(wanted / max(1, candidates))))
    size, extra = divmod(n_splits, groups)
    out, start = [], 0
    for g in range(groups):
        stop = start + size + (1 if g < extra else 0)
        out.append(tuple(range(start, stop)))
        start = stop
    return tuple(out)
