"""The plain description of an exploration.

``pipelines`` builds these immutable values; ``graph.compile`` turns them into a
Dask graph.  Nothing here imports Dask, runs a step, or knows about the builder.

>>> def load(): return [1, 2, 3]
>>> src = SourceSpec(pipeline="demo", call=Call(load, (), "load"))
>>> describe(src)
"pipeline 'demo', source(load)"
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

__all__ = [
    "Call",
    "Alternative",
    "SourceSpec",
    "StepSpec",
    "ExploreSpec",
    "CombineSpec",
    "ChooseSpec",
    "PruneSpec",
    "SearchSpec",
    "Spec",
    "describe",
    "upstream",
    "explore_names",
    "fn_name",
    "pipeline_name",
    "max_branches",
    "count_branches",
    "branch_limit",
    "BRANCH_LIMIT",
]

Params = tuple[tuple[str, Any], ...]


def fn_name(fn: Callable) -> str:
    """A readable name for a callable (``functools.partial`` and callable objects included)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and callable(inner):
        return fn_name(inner)
    name = getattr(fn, "__name__", None)
    if name is None:
        name = type(fn).__name__
    return "lambda" if name == "<lambda>" else name


@dataclass(frozen=True, eq=False)
class Call:
    """A function with bound keyword parameters (in the order the user gave them)."""

    fn: Callable
    params: Params
    label: str
    size_hint: int | None = None  # expected bytes of the output (memory planning; not part of the key)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @classmethod
    def of(cls, fn: Callable, params: Params = ()) -> "Call":
        """Bind ``params`` to ``fn``; a ``functools.partial`` with keywords only is unwrapped,
        so ``partial(f, n=1)`` and ``f`` with ``n=1`` are the same work.

        >>> import functools
        >>> def f(x, n): return x + n
        >>> Call.of(functools.partial(f, n=1)).params
        (('n', 1),)
        """
        while isinstance(fn, functools.partial) and not fn.args:
            params = tuple(fn.keywords.items()) + tuple(p for p in params if p[0] not in fn.keywords)
            fn = fn.func
        return cls(fn, tuple(params), fn_name(fn))


@dataclass(frozen=True, eq=False)
class Alternative:
    """One alternative of an explore: its label, function and parameters; ``space``: parameters
    a search's sampler proposes, ``((name, distribution), ...)`` (``pipelines.space``; issue 47)."""

    label: str
    call: Call
    space: Params = ()


@dataclass(frozen=True, eq=False)
class SourceSpec:
    pipeline: str
    call: Call


@dataclass(frozen=True, eq=False)
class StepSpec:
    input: "Spec"
    call: Call


@dataclass(frozen=True, eq=False)
class ExploreSpec:
    input: "Spec"
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, eq=False)
class CombineSpec:
    inputs: tuple[tuple[str, "Spec"], ...]
    call: Call


@dataclass(frozen=True)
class PruneSpec:
    """Asynchronous successive halving for a choose (docs/architecture.md §7): what
    ``pipelines.halving`` returns, a plain value (validated there).

    Rungs are at ``min_iter * factor**r`` reports (r = 0, 1, ...), below ``max_iter``;
    a branch that makes ``max_iter`` reports stops there and completes (not pruned).

    >>> p = PruneSpec(factor=3, min_iter=2, max_iter=20)
    >>> p.rungs(100), p.rung_of(6), p.rung_of(5), p.rung_of(18), p.rung_iteration(1)
    ((2, 6, 18), 1, None, 2, 6)
    >>> p.ends(19), p.ends(20)
    (False, True)
    >>> PruneSpec(factor=2, min_iter=1, max_iter=4).rungs(100)
    (1, 2)
    """

    factor: int = 3
    min_iter: int = 1
    max_iter: int | None = None

    def ends(self, iteration: int) -> bool:
        """Whether the report that makes ``iteration`` reports ends the branch (``max_iter``):
        it completes there, unasked, and is not pruned."""
        return self.max_iter is not None and iteration >= self.max_iter

    def rung_of(self, iteration: int) -> int | None:
        """The rung index ``r`` if ``iteration`` (reports made, from 1) is a rung, else ``None``."""
        if self.ends(iteration):
            return None
        r, at = 0, self.min_iter
        while at < iteration:
            r, at = r + 1, at * self.factor
        return r if at == iteration else None

    def rung_iteration(self, r: int) -> int:
        """The reports a branch has made at rung ``r``: ``min_iter * factor**r``."""
        return self.min_iter * self.factor**r

    def rungs(self, upto: int) -> tuple[int, ...]:
        """The rung iterations up to ``upto`` (included), in order."""
        out, at = [], self.min_iter
        while at <= upto and (self.max_iter is None or at < self.max_iter):
            out.append(at)
            at *= self.factor
        return tuple(out)


@dataclass(frozen=True, eq=False)
class ChooseSpec:
    input: "Spec"
    metric: Union[str, Callable[[Any], Any]]
    metric_name: str
    mode: str = "max"
    k: int | None = None
    threshold: float | None = None
    per: str | None = None
    prune: PruneSpec | None = None  # halving while the (iterative) input steps run

    @property
    def single(self) -> bool:
        """True when at most one branch per group can be kept."""
        return self.k == 1 or (self.k is None and self.threshold is None)


@dataclass(frozen=True, eq=False)
class SearchSpec:
    """An adaptive search over the branches flowing in (issue 47): ``n_trials`` proposals of a
    sampler (any Optuna sampler, or the ``study``'s), ``in_flight`` of them at a time (``None``:
    the cluster's threads), each a branch whose ``metric`` is told to the sampler. What
    ``Node.search`` returns, checked there; ``graph.run.adaptive`` runs it.
    ``param_names``: the names the sampler sees, ``"qualified"`` (``"<explore>.<param>"``,
    ``graph.compiling.trials``) or ``"plain"`` (a parameter's own name, which must then be
    unique: a drop-in whose study uses the names its user gave, ``pipelines.sklearn.OptunaSearchCV``).
    ``user_attrs``: each trial's last step's scalar entries become the trial's user attributes
    (set before it is told, so they are in any storage with it). ``pruner``: an Optuna pruner for
    the study the search creates (``None``: none; a given ``study`` brings its own), which judges
    an iterative last step's reports (``graph.state.proposals``)."""

    input: "Spec"
    metric: Union[str, Callable[[Any], Any]]
    metric_name: str
    mode: str = "max"
    n_trials: int = 100
    in_flight: int | None = None
    sampler: Any = None
    study: Any = None
    param_names: str = "qualified"
    user_attrs: bool = False
    pruner: Any = None


Spec = Union[SourceSpec, StepSpec, ExploreSpec, CombineSpec, ChooseSpec, SearchSpec]


def upstream(spec: Spec) -> tuple[Spec, ...]:
    """The specs feeding ``spec`` directly."""
    if isinstance(spec, SourceSpec):
        return ()
    if isinstance(spec, CombineSpec):
        return tuple(s for _, s in spec.inputs)
    return (spec.input,)


def pipeline_name(spec: Spec) -> str:
    while not isinstance(spec, SourceSpec):
        spec = upstream(spec)[0]
    return spec.pipeline


def describe(spec: Spec) -> str:
    """A short, human description of one node, used in every error message."""
    if isinstance(spec, SourceSpec):
        what = f"source({spec.call.label})"
    elif isinstance(spec, StepSpec):
        what = f"then({spec.call.label})"
    elif isinstance(spec, ExploreSpec):
        what = f"explore({spec.name!r})"
    elif isinstance(spec, CombineSpec):
        what = f"combine({spec.call.label}, {', '.join(n for n, _ in spec.inputs)})"
    elif isinstance(spec, SearchSpec):
        what = f"search({spec.metric_name!r})"
    else:
        what = f"choose({spec.metric_name!r})"
    return f"pipeline {pipeline_name(spec)!r}, {what}"


def explore_names(spec: Spec) -> tuple[str, ...]:
    """Every explore name upstream of (and including) ``spec``, in first-seen order."""
    seen: dict[str, None] = {}
    stack = [spec]
    order: list[Spec] = []
    visited: set[int] = set()
    while stack:
        s = stack.pop()
        if id(s) in visited:
            continue
        visited.add(id(s))
        order.append(s)
        stack.extend(reversed(upstream(s)))
    for s in reversed(order):
        if isinstance(s, ExploreSpec):
            seen.setdefault(s.name, None)
    return tuple(seen)


def _branches(spec: Spec, decided: bool, memo: dict) -> int:
    """Branches at ``spec``: after every choose upstream has decided (``decided``), or before."""
    if id(spec) in memo:
        return memo[id(spec)]
    if isinstance(spec, SourceSpec):
        n = 1
    elif isinstance(spec, ExploreSpec):
        n = _branches(spec.input, decided, memo) * len(spec.alternatives)
    elif isinstance(spec, CombineSpec):
        n = 1
        for s in upstream(spec):
            n *= _branches(s, decided, memo)
    else:
        n = _branches(spec.input, decided, memo)
        if decided and isinstance(spec, SearchSpec):  # the best trial is its value
            n = min(n, 1)
        if decided and isinstance(spec, ChooseSpec) and spec.per is None:
            if spec.single:
                n = min(n, 1)
            elif spec.k is not None:
                n = min(n, spec.k)
    memo[id(spec)] = n
    return n


def max_branches(spec: Spec) -> int:
    """Upper bound of the branches at ``spec`` once every choose upstream has decided.

    >>> def load(): return 1
    >>> max_branches(SourceSpec("p", Call(load, (), "load")))
    1
    """
    return _branches(spec, True, {})


#: Default cap on the branches one node may have (each branch is at least one task); the
#: environment variable ``QUIVER_BRANCH_LIMIT`` overrides it (``0`` or ``none``: no limit).
BRANCH_LIMIT = 100_000


def branch_limit(environ: Any = None) -> int | None:
    """The branch cap in force: ``QUIVER_BRANCH_LIMIT`` in ``environ`` (default ``os.environ``)
    if set, else :data:`BRANCH_LIMIT`; ``None`` means no limit.

    >>> branch_limit({}) == BRANCH_LIMIT
    True
    >>> branch_limit({"QUIVER_BRANCH_LIMIT": "2_500"}), branch_limit({"QUIVER_BRANCH_LIMIT": "none"})
    (2500, None)
    """
    import os

    env = os.environ if environ is None else environ
    raw = env.get("QUIVER_BRANCH_LIMIT", "").strip().replace("_", "")
    if not raw:
        return BRANCH_LIMIT
    if raw.lower() in ("0", "none", "off"):
        return None
    try:
        n = int(float(raw))
    except ValueError:
        raise ValueError(f"QUIVER_BRANCH_LIMIT must be a whole number (or 0/none for no limit), got {raw!r}") from None
    return n if n > 0 else None


def count_branches(spec: Spec) -> int:
    """Branches flowing into ``spec`` before any choose decides (what the compiled graph holds
    tasks for); for a combine, the product of its inputs (an upper bound of the join).

    >>> def load(): return 1
    >>> count_branches(SourceSpec("p", Call(load, (), "load")))
    1
    """
    return _branches(spec, False, {})
