"""The builder API: ``Pipeline``, ``Node`` and ``combine``.

Nodes are immutable values.  Building a pipeline runs nothing: it only checks the
definition (raising ``PipelineError`` that names the node and the fix) and
records a plain ``graph.spec`` description.

>>> from pipelines import Pipeline, grid
>>> def load(seed): return list(range(10))
>>> def scale(xs, factor): return [x * factor for x in xs]
>>> def score(xs): return {"total": sum(xs)}
>>> p = Pipeline("demo")
>>> best = (p.source(load, seed=0)
...           .explore("scale", grid(scale, factor=[1, 2, 3]))
...           .then(score)
...           .choose("total", mode="max"))
>>> best
<Node pipeline 'demo', choose('total'): up to 1 branch>
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graph.errors import PipelineError
from graph.spec import (
    Call,
    ChooseSpec,
    PruneSpec,
    CombineSpec,
    ExploreSpec,
    SearchSpec,
    SourceSpec,
    Spec,
    StepSpec,
    describe,
    explore_names,
    fn_name,
    max_branches,
)
from graph.spec import branch_limit, count_branches

from .alternatives import count, expand
from .space import is_distribution

__all__ = ["Pipeline", "Node", "combine"]


def _check_callable(where: str, fn: Any, role: str) -> None:
    if not callable(fn):
        raise PipelineError(
            f"{where}: the {role} must be a callable, got {type(fn).__name__} {fn!r}. "
            "Pass the function itself (fn, not fn())."
        )


def _check_call(where: str, call: Call, inputs: tuple[str, ...] | None) -> None:
    """Check that ``call.fn`` accepts the value(s) it will get plus its parameters."""
    from graph.keys import check_tokenizable  # imports Dask: only when a pipeline is built

    check_tokenizable(where, f"step function {call.label}", call.fn)
    for name, value in call.params:
        if isinstance(value, Node):
            raise PipelineError(
                f"{where}: parameter {name!r} of {call.label} is a pipeline node; parameters are fixed "
                f"values. To feed a node's output into a step, use combine({call.label}, {name}=node, ...)."
            )
        if is_distribution(value):
            raise PipelineError(
                f"{where}: parameter {name!r} of {call.label} is an Optuna distribution, which only a "
                f"search proposes from: write explore(name, space({call.label}, {name}=...)) and run it "
                "with .search(metric, n_trials=...)."
            )
        check_tokenizable(where, f"parameter {name!r} of {call.label}", value)
    try:
        sig = inspect.signature(call.fn)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return
    if inputs is None:
        args, kwargs, shape = (object(),), {}, f"{call.label}(value, **params)"
    else:
        args, kwargs = (), {n: object() for n in inputs}
        shape = f"{call.label}({', '.join(inputs)}{', **params' if inputs else '**params'})"
    try:
        sig.bind(*args, **kwargs, **call.param_dict)
    except TypeError as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in call.params) or "no parameters"
        raise PipelineError(
            f"{where}: {call.label}{sig} cannot be called as {shape} with {given}: {exc}. "
            "Fix the parameter names, or the step's signature."
        ) from None


def _check_branch_limit(where: str, upstream: int, alternatives: int) -> None:
    """Refuse an explore whose branches (before any choose) would pass ``branch_limit()``."""
    limit = branch_limit()
    total = upstream * alternatives
    if limit is not None and total > limit:
        raise PipelineError(
            f"{where}: this explore would make {total:,} branches ({upstream:,} flowing in x "
            f"{alternatives:,} alternatives), above the limit of {limit:,}: every branch is at least "
            "one task, so nothing has been built (a choose upstream does not reduce this: the graph "
            "holds the tasks of every branch it might keep). Narrow the grid, split the exploration "
            "into two pipelines (explore, choose, then explore from the chosen value), "
            f"or raise the limit: QUIVER_BRANCH_LIMIT={total} in the environment (quiver run "
            f"--branch-limit {total})."
        )


def _producers(spec: Spec) -> list[Call]:
    """The step calls whose outputs are the branch values flowing out of ``spec``."""
    if isinstance(spec, ChooseSpec):
        return _producers(spec.input)
    if isinstance(spec, ExploreSpec):
        return [a.call for a in spec.alternatives]
    return [spec.call]


def _check_prune(where: str, spec: Spec, prune: Any) -> None:
    """``prune=`` must be a ``halving(...)`` over iterative steps."""
    from graph.tasks.iterative import is_iterative

    if not isinstance(prune, PruneSpec):
        raise PipelineError(
            f"{where}: prune= takes the rule pipelines.halving(factor=3, min_iter=1, max_iter=None) "
            f"returns, got {type(prune).__name__} {prune!r}. Write prune=pipelines.halving(...)."
        )
    plain = sorted({c.label for c in _producers(spec) if not is_iterative(c.fn)})
    if plain:
        raise PipelineError(
            f"{where}: prune= stops branches while their steps run, so the steps feeding this choose "
            f"must be iterative (a generator function that yields one report mapping per iteration, "
            f"or gpu.train); {', '.join(plain)} {'is' if len(plain) == 1 else 'are'} not. Make "
            "the step yield its reports (yield {'accuracy': acc}), or drop prune=."
        )


def _label(fn: Any) -> str:
    return fn_name(fn) if callable(fn) else repr(fn)


def _call(fn: Callable, params: dict[str, Any]) -> Call:
    return Call.of(fn, tuple(params.items()))


@dataclass(frozen=True, eq=False)
class Node:
    """One point of a pipeline; every branch flowing into it continues from here."""

    spec: Spec

    def __repr__(self) -> str:
        n = max_branches(self.spec)
        return f"<Node {describe(self.spec)}: up to {n} branch{'' if n == 1 else 'es'}>"

    # ---- building -------------------------------------------------------------------------
    def then(self, fn: Callable, **params: Any) -> "Node":
        """Apply ``fn(value, **params)`` to every branch flowing into this node.

        >>> from pipelines import Pipeline
        >>> Pipeline("p").source(lambda: 1).then(abs)
        <Node pipeline 'p', then(abs): up to 1 branch>
        """
        where = f"{describe(self.spec)} -> then({_label(fn)})"
        from .search import refuse_after_search

        refuse_after_search(where, self.spec)
        _check_callable(where, fn, "step")
        call = _call(fn, params)
        _check_call(where, call, None)
        return Node(StepSpec(self.spec, call))

    def explore(self, name: str, *alternatives: Any, **named_alternatives: Any) -> "Node":
        """Branch out: one branch per alternative (a callable, ``name=callable`` or ``grid(...)``).

        >>> from pipelines import Pipeline, grid
        >>> def f(x, a): return x + a
        >>> Pipeline("p").source(lambda: 1).explore("add", grid(f, a=[1, 2]), two=lambda x: 2 * x)
        <Node pipeline 'p', explore('add'): up to 3 branches>
        """
        where = f"{describe(self.spec)} -> explore({name!r})"
        from .search import refuse_after_search

        refuse_after_search(where, self.spec)
        if not isinstance(name, str) or not name.strip():
            raise PipelineError(
                f"{where}: the explore name must be a non-empty string naming the choice "
                "(it becomes a table column), e.g. explore('scaler', ...)."
            )
        if name in explore_names(self.spec):
            raise PipelineError(
                f"{where}: an explore named {name!r} is already upstream on this path, so its "
                "column would be ambiguous. Give this explore another name, e.g. "
                f"explore({name + '_2'!r}, ...)."
            )
        _check_branch_limit(where, count_branches(self.spec), count(alternatives, named_alternatives, where))
        alts = expand(where, alternatives, named_alternatives)
        for alt in alts:
            call = alt.call
            if alt.space:  # the signature must take the proposed parameters too
                call = Call(call.fn, call.params + tuple((n, None) for n, _ in alt.space), call.label)
            _check_call(f"{where}, alternative {alt.label!r}", call, None)
        return Node(ExploreSpec(self.spec, name, alts))

    def choose(
        self,
        metric: str | Callable[[Any], float],
        mode: str = "max",
        k: int | None = None,
        threshold: float | None = None,
        per: str | None = None,
        prune: PruneSpec | None = None,
    ) -> "Node":
        """Keep the best branches by ``metric`` (see docs/architecture.md §2 for each mode).

        ``metric`` is a key of the step's mapping output, or a callable on it.
        Neither ``k`` nor ``threshold``: the single best.  ``k``: the top ``k``.
        ``threshold``: every branch at or past it.  Both: the first ``k`` to reach
        it, in completion order, cancelling the rest.  ``per="explore name"``:
        choose separately inside each alternative of that explore.  Ties go to the
        branch declared first; a NaN metric ranks last and never meets a threshold.
        ``prune=pipelines.halving(...)``: while the input steps (iterative: generator
        functions or ``gpu.train``) run, stop the losing ones at each rung, reading
        ``metric`` off their reports (docs/architecture.md §7).

        >>> from pipelines import Pipeline, grid
        >>> def f(x, a): return {"score": x + a}
        >>> Pipeline("p").source(lambda: 1).explore("a", grid(f, a=[1, 2, 3])).choose("score", k=2)
        <Node pipeline 'p', choose('score'): up to 2 branches>
        """
        label = metric if isinstance(metric, str) else fn_name(metric) if callable(metric) else repr(metric)
        where = f"{describe(self.spec)} -> choose({label!r})"
        if not isinstance(metric, str) and not callable(metric):
            raise PipelineError(
                f"{where}: metric must be a key of the step's output mapping (a string) or a "
                f"callable on the output, got {type(metric).__name__}."
            )
        if mode not in ("max", "min"):
            raise PipelineError(
                f"{where}: unknown mode {mode!r}; use mode='max' (higher is better) or "
                "mode='min' (lower is better)."
            )
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
            raise PipelineError(f"{where}: k must be a whole number >= 1, got {k!r}.")
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or math.isnan(threshold):
                raise PipelineError(f"{where}: threshold must be a real number (not NaN), got {threshold!r}.")
        names = explore_names(self.spec)
        if not names:
            raise PipelineError(
                f"{where}: nothing is explored upstream, so there is only one branch to choose "
                "from. Add an explore(...) before this choose, or remove the choose."
            )
        if per is not None and per not in names:
            raise PipelineError(
                f"{where}: per={per!r} is not an explore upstream of this choose; use one of "
                f"{list(names)}."
            )
        if prune is not None:
            _check_prune(where, self.spec, prune)
        from .search import refuse_space_upstream

        refuse_space_upstream(where, self.spec)
        return Node(
            ChooseSpec(
                self.spec,
                metric,
                label,
                mode,
                None if k is None else int(k),
                None if threshold is None else float(threshold),
                per,
                prune,
            )
        )

    def search(
        self,
        metric: str | Callable[[Any], float],
        mode: str = "max",
        *,
        n_trials: int = 100,
        sampler: Any = None,
        study: Any = None,
        in_flight: int | None = None,
        pruner: Any = None,
    ) -> "Node":
        """An adaptive search over the branches flowing in (issue 47; docs/guide/adaptive.md):
        a sampler proposes ``n_trials`` branches, each explore's alternative (a categorical
        choice named after the explore) and the distributions of ``space(...)`` alternatives,
        ``in_flight`` at a time (default: the cluster's threads), as results arrive; every
        branch is a trial told ``metric`` (``mode="max"``/``"min"``). ``sampler``: any Optuna
        sampler (default: Optuna's, TPE); or ``study``: an ``optuna.Study`` (any storage) whose
        sampler, direction and earlier trials the search continues. Shared prefixes of the
        proposals run once. ``.run()`` returns a :class:`pipelines.SearchResult`. ``pruner``: an
        Optuna pruner (``optuna.pruners.MedianPruner()``) that judges each report of a generator
        last step and stops the trials it prunes mid-training (with ``study=``, the study's own).

        >>> from optuna.distributions import FloatDistribution
        >>> from pipelines import Pipeline, space
        >>> def f(x, a): return {"score": -(x - a) ** 2}
        >>> Pipeline("p").source(lambda: 1).explore("a", space(f, a=FloatDistribution(0, 2))).search("score", n_trials=5)
        <Node pipeline 'p', search('score'): up to 1 branch>
        """
        from .search import check_search

        label = metric if isinstance(metric, str) else fn_name(metric) if callable(metric) else repr(metric)
        where = f"{describe(self.spec)} -> search({label!r})"
        check_search(where, self.spec, metric, mode, n_trials, sampler, study, in_flight, pruner)
        return Node(SearchSpec(self.spec, metric, label, mode, int(n_trials),
                               None if in_flight is None else int(in_flight), sampler, study, pruner=pruner))

    def size_hint(self, nbytes: Any) -> "Node":
        """Say how big this node's step output is (per branch), for the memory plan.

        ``nbytes``: bytes or a string like ``"40 MiB"``.  Applies to every
        alternative of an explore.  Measured sizes replace hints as a run proceeds.

        >>> from pipelines import Pipeline
        >>> n = Pipeline("p").source(lambda: b"x" * 100).size_hint("1 kB")
        >>> n.spec.call.size_hint
        1000
        """
        import dataclasses

        from graph.memory.sizes import parse_bytes

        where = f"{describe(self.spec)} -> size_hint({nbytes!r})"
        try:
            n = parse_bytes(nbytes, "size_hint")
        except ValueError as exc:
            raise PipelineError(f"{where}: {exc}") from None
        spec = self.spec
        if isinstance(spec, ExploreSpec):
            alts = tuple(
                dataclasses.replace(a, call=dataclasses.replace(a.call, size_hint=n)) for a in spec.alternatives
            )
            return Node(dataclasses.replace(spec, alternatives=alts))
        if not hasattr(spec, "call"):
            raise PipelineError(f"{where}: a choose produces no new data; put the hint on the step before it")
        return Node(dataclasses.replace(spec, call=dataclasses.replace(spec.call, size_hint=n)))

    # ---- compiling and running ------------------------------------------------------------------
    def compile(self):
        """The compiled Dask graph of this node (``graph.compile``): inspect it without a cluster."""
        import graph

        return graph.compile(self)

    def run(self, client: Any = None, **options: Any):
        """Run the exploration and return a :class:`pipelines.Result`.

        ``client``: a ``distributed.Client``, a scheduler address, or ``None`` for an
        embedded ``LocalCluster``, kept after the run for this process's next run of the
        same shape (``graph.cluster.embedded``: closed after an idle timeout, 300 s by
        default, when a run asks for another shape, after a failed run, at exit, or by
        ``graph.close_kept()``).  Options: ``workers``,
        ``threads_per_worker``, ``memory_limit`` (embedded cluster only),
        ``progress`` (``True``/``False``; default: only on a terminal), ``quiet``
        (no dashboard line, and no closing line on start-up's share of a short run), ``raise_if_all_failed`` (default ``True``),
        ``memory_budget`` (total bytes for all workers, e.g. ``"2 GiB"``: the run follows
        a memory plan, see ``graph.plan_memory``; on an embedded cluster it also sets
        the workers' memory limits), ``sample_sizes`` (measure the first branch before
        planning), ``order`` (``"depth-first"``, or ``"dask"`` for Dask's own ordering),
        ``on_metric_error`` (``"stop"``, the default: when the first branches at a choose cannot
        give their metric for the same reason, the run ends at once with a ``RunError``
        naming it; ``"continue"``: run every branch anyway), ``pack`` (``True``, the default:
        ``gpu.train`` branches that can share a worker train together as one stacked group,
        see ``graph.compiling.packing``; ``False``: every branch trains alone), ``compute_value`` (a kept
        value holding Dask collections is computed and gathered; default: persisted on
        the cluster, which an embedded cluster keeps open until ``Result.close()``).
        """
        from .runner import run_node

        return run_node(self, client, **options)  # an unknown option: a TypeError naming the known ones


def combine(fn: Callable, **inputs: Any) -> Node:
    """Feed several nodes into one step ``fn(**values, **params)``.

    Keyword arguments that are nodes are inputs; the others are fixed parameters.
    Branches are joined on the explore names the inputs share (same choice) and
    crossed on the rest.

    >>> from pipelines import Pipeline, combine
    >>> p = Pipeline("p")
    >>> a = p.source(lambda: 1).explore("x", one=lambda v: v, two=lambda v: 2 * v)
    >>> b = a.explore("y", neg=lambda v: -v, pos=lambda v: v)
    >>> combine(lambda left, right: left + right, left=a, right=b)
    <Node pipeline 'p', combine(lambda, left, right): up to 8 branches>
    """
    where = f"combine({_label(fn)})"
    _check_callable(where, fn, "combine step")
    nodes = {k: v for k, v in inputs.items() if isinstance(v, Node)}
    params = {k: v for k, v in inputs.items() if not isinstance(v, Node)}
    if not nodes:
        raise PipelineError(
            f"{where}: no input nodes given; pass them as keywords, e.g. combine(fn, left=a, right=b)."
        )
    call = _call(fn, params)
    first = next(iter(nodes.values())).spec
    _check_call(f"{describe(first)} -> {where}", call, tuple(nodes))
    from .search import refuse_space_upstream

    for n in nodes.values():
        refuse_space_upstream(f"{describe(first)} -> {where}", n.spec)
    return Node(CombineSpec(tuple((k, n.spec) for k, n in nodes.items()), call))


class Pipeline:
    """A named exploration; ``source`` starts it.

    >>> Pipeline("digits").source(lambda seed: seed, seed=0)
    <Node pipeline 'digits', source(lambda): up to 1 branch>
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise PipelineError(f"Pipeline name must be a non-empty string, got {name!r}.")
        self.name = name

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r})"

    def source(self, fn: Callable, **params: Any) -> Node:
        """Start a branch with ``fn(**params)`` (a source has no input value)."""
        where = f"pipeline {self.name!r}, source({_label(fn)})"
        _check_callable(where, fn, "source")
        call = _call(fn, params)
        _check_call(where, call, ())
        return Node(SourceSpec(self.name, call))

