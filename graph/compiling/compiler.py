"""Compile an exploration (``graph.spec``) into one Dask graph of ``dask.task_spec`` tasks.

Every step instance becomes one ``Task`` whose key is a deterministic token of
(function identity, parameters, input keys), so branches that reach the same
work share one task.  Downstream of a choose, the graph holds the tasks of every
branch that *could* be kept; the executor submits only those actually kept.

>>> from graph.spec import SourceSpec, ExploreSpec, Alternative, Call
>>> def load(): return 1
>>> def add(x, n): return x + n
>>> src = SourceSpec("demo", Call(load, (), "load"))
>>> alts = tuple(Alternative("add", Call(add, (("n", n),), "add")) for n in (1, 2))
>>> c = compile_spec(ExploreSpec(src, "plus", alts))
>>> (c.naive_tasks, c.unique_tasks, len(c.branches))
(4, 3, 2)
>>> c.branches[1].choices
{'plus': ('add', {'n': 2})}
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dask.task_spec import Task, TaskRef

from ..errors import PipelineError
from ..keys import TokenizationError, metric_key, step_key
from ..scalars import scalar_entries
from ..state.metric import extract_metric
from ..tasks.fusedmetric import ReadsMetrics
from ..tasks.iterative import is_iterative, iterative_task
from ..tasks.plainvalues import PlainStep
from ..tasks.shipping import shippable
from .collections import is_lazy_marked
from .tokencache import function_tokens_once
from ..spec import (
    Call,
    ChooseSpec,
    CombineSpec,
    ExploreSpec,
    SourceSpec,
    Spec,
    StepSpec,
    describe,
    max_branches,
)

__all__ = [
    "Branch",
    "ChoosePoint",
    "CompiledPipeline",
    "compile_spec",
    "dependents_of",
    "fuses_read",
    "params_token",
    "reads_for_run",
    "scalar_entries",
]

Choice = tuple[str, str, tuple]  # (explore name, label, params)
Gate = tuple[int, int]  # (choose point index, input branch index)


@dataclass(frozen=True)
class Branch:
    """One branch reaching one node: its choices, its value's key and its path."""

    choice_items: tuple[Choice, ...]
    key: str
    lineage: tuple[str, ...]
    gates: tuple[Gate, ...] = ()
    #: a collection step's lazy value (graph/compiling/collections.py); ``None`` for a plain value
    lazy: Any = field(default=None, compare=False, repr=False)
    #: the partitions an output branch's value is made of (held for the user; collections only)
    parts: tuple = field(default=(), compare=False, repr=False)

    @property
    def choices(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """``{explore name: (label, params)}`` in the order the explores were applied."""
        return {name: (label, dict(params)) for name, label, params in self.choice_items}


@dataclass
class ChoosePoint:
    """A choose and the branches flowing into it (with the keys of their metric tasks)."""

    index: int
    spec: ChooseSpec
    inputs: list[Branch]
    metric_keys: list[str]

    def group_of(self, i: int) -> Any:
        """The ``per`` group of input ``i``: ``(label, params)`` of its alternative of the
        ``per`` explore, or ``(label, ("token", <token of params>))`` when the parameter values
        cannot be hashed (arrays): groups are dict keys, and an array has no ``==`` that says
        equal or not."""
        if self.spec.per is None:
            return None
        for name, label, params in self.inputs[i].choice_items:
            if name == self.spec.per:
                try:
                    hash(params)
                except TypeError:
                    return (label, ("token", params_token(params)))
                return (label, params)
        return None


@dataclass
class CompiledPipeline:
    """The whole exploration as one Dask graph, plus everything needed to run and report it.

    ``graph`` maps each step key to its ``Task``; ``metric_graph`` holds the small
    tasks that read each choose metric off a branch's value; ``branches`` are the
    output node's branches (one per table row), in declaration order.  ``fused`` maps
    each metric key whose read runs inside its step's task (``graph.tasks.fusedmetric``) to
    that step's key: its read task in ``metric_graph`` runs only if the step's message
    never comes (:func:`fuses_read` decides which reads are fused).
    """

    graph: dict[str, Task]
    metric_graph: dict[str, Task]
    branches: list[Branch]
    chooses: list[ChoosePoint]
    output: Spec
    max_kept: int
    dependents: dict[str, set[str]] = field(default_factory=dict)
    size_hints: dict[str, int] = field(default_factory=dict)
    #: a Dask collection task's key -> the key of the step that built it (graph/compiling/collections.py):
    #: a failed partition names its step in the table, not the Dask layer it came from
    step_of: dict = field(default_factory=dict)
    #: graph/compiling/packing.py (``run(pack=True)``): packed task -> its group's member keys, the groups'
    #: claim tables (graph/compiling/packing.py, their rule graph/state/claims.py), and packed task -> the worker thread it is placed on
    packed: dict = field(default_factory=dict)
    claim_tables: list = field(default_factory=list)
    placement: dict = field(default_factory=dict)
    fused: dict = field(default_factory=dict)

    @property
    def output_keys(self) -> list[str]:
        return [b.key for b in self.branches]

    @property
    def has_collections(self) -> bool:
        """Whether a step builds a Dask collection or a branch's value is one (partitions:
        Dask places them, and they may be large)."""
        return bool(self.step_of) or any(b.parts for b in self.branches)

    @property
    def naive_tasks(self) -> int:
        """Tasks if every output branch ran its own full path, sharing nothing."""
        return sum(len(b.lineage) for b in self.branches)

    @property
    def unique_tasks(self) -> int:
        """Step tasks in the compiled graph (identical work counted once)."""
        return len(self.graph)

    @property
    def explore_names(self) -> list[str]:
        names: dict[str, None] = {}
        for b in self.branches:
            for name, _, _ in b.choice_items:
                names.setdefault(name, None)
        return list(names)

    @property
    def single_value(self) -> bool:
        """True when the output can hold at most one kept branch (``Result.value`` is not a list)."""
        return self.max_kept == 1

    def __repr__(self) -> str:
        return (
            f"<CompiledPipeline {describe(self.output)}: {len(self.branches)} branches, "
            f"{self.unique_tasks} unique tasks ({self.naive_tasks} naive), "
            f"{len(self.chooses)} choose point(s)>"
        )


class _Compiler:
    def __init__(self) -> None:
        self.graph: dict[str, Task] = {}
        self.metric_graph: dict[str, Task] = {}
        self.chooses: list[ChoosePoint] = []
        self.memo: dict[int, list[Branch]] = {}
        self.size_hints: dict[str, int] = {}
        self._collections = None
        self._ptokens: dict[int, tuple[tuple, str]] = {}  # id(params) -> (params, token)
        self._plain: dict[tuple, PlainStep] = {}
        self.reads: dict[str, dict[str, tuple]] = {}  # step key -> {metric key: (metric, where)}: fusable reads

    def _same_choice(self, a: tuple, b: tuple) -> bool:
        """Two ``(label, params)`` choices are the same alternative: same label, parameters
        equal by token (cached per params tuple: combines compare the same tuples many times)."""
        if a[0] != b[0]:
            return False
        if a[1] is b[1]:
            return True
        return self._params_token(a[1]) == self._params_token(b[1])

    def _params_token(self, params: tuple) -> str:
        hit = self._ptokens.get(id(params))
        if hit is None or hit[0] is not params:
            hit = self._ptokens[id(params)] = (params, params_token(params))
        return hit[1]

    @property
    def collections(self):
        """Collection steps (graph/compiling/collections.py), loaded when a pipeline needs them."""
        if self._collections is None:
            from .collections import CollectionSteps

            self._collections = CollectionSteps(self.graph, self.size_hints, _lazy_branch)
        return self._collections

    def key(self, spec: Spec, call: Call, inputs: tuple) -> str:
        try:
            return step_key(call.fn, call.param_dict, inputs)
        except TokenizationError as exc:
            raise PipelineError(
                f"{describe(spec)}: step {call.label} cannot be given a deterministic key ({exc}). "
                "Use plain parameter values or give objects a __dask_tokenize__ method."
            ) from None

    def task(self, spec: Spec, call: Call, inputs: tuple, args: tuple, kwargs: dict) -> str:
        key = self.key(spec, call, inputs)
        if key not in self.graph:
            if is_iterative(call.fn):  # it reports as it runs (docs/architecture.md §7.2); the key is unchanged
                self.graph[key] = iterative_task(Task(key, shippable(call.fn), *args, **kwargs, **call.param_dict))
            else:  # a plain step: a Dask collection as its value is refused at once (graph/tasks/plainvalues.py)
                self.graph[key] = Task(key, self.plain(spec, call), *args, **kwargs, **call.param_dict)
        if call.size_hint is not None:
            self.size_hints[key] = int(call.size_hint)
        return key

    def plain(self, spec: Spec, call: Call) -> PlainStep:
        """One wrapper per (node, function): every branch's task shares it (pickled once)."""
        where = describe(spec)
        memo = (id(call.fn), where, call.label)
        if memo not in self._plain:
            self._plain[memo] = PlainStep(shippable(call.fn), where, call.label, source=isinstance(spec, SourceSpec))
        return self._plain[memo]

    def branches(self, spec: Spec) -> list[Branch]:
        if id(spec) not in self.memo:
            self.memo[id(spec)] = self._branches(spec)
        return self.memo[id(spec)]

    def _branches(self, spec: Spec) -> list[Branch]:
        if isinstance(spec, SourceSpec):
            if is_lazy_marked(spec.call.fn):  # a lazy source (graph/compiling/collections.py)
                key = self.key(spec, spec.call, ())
                return [self.collections.source(describe(spec), spec.call, key)]
            key = self.task(spec, spec.call, (), (), {})
            return [Branch((), key, (key,))]
        if isinstance(spec, StepSpec):
            return [self._extend(spec, b, spec.call, b.choice_items) for b in self.branches(spec.input)]
        if isinstance(spec, ExploreSpec):
            if any(a.space for a in spec.alternatives):  # issue 47: a sampler proposes its parameters
                raise PipelineError(
                    f"{describe(spec)}: space(...) alternatives have parameters only a search proposes; "
                    "end the pipeline with .search(metric, n_trials=...) and run that node "
                    "(graph.compiling.trials compiles one proposal at a time)."
                )
            out = []
            for b in self.branches(spec.input):
                for alt in spec.alternatives:
                    items = b.choice_items + ((spec.name, alt.label, alt.call.params),)
                    out.append(self._extend(spec, b, alt.call, items))
            return out
        if isinstance(spec, CombineSpec):
            return self._combine(spec)
        if not isinstance(spec, ChooseSpec):  # a SearchSpec: compiled per proposal (graph.compiling.trials)
            raise PipelineError(
                f"{describe(spec)}: a search is compiled one proposal at a time as it runs; run the node "
                "(node.run()), or compile its input (graph.compile(node.spec.input) for a listed explore)."
            )
        return self._choose(spec)

    def _extend(self, spec: Spec, b: Branch, call: Call, items: tuple) -> Branch:
        if b.lazy is not None or is_lazy_marked(call.fn):  # a collection step, or a plain one on a computed value
            key = self.key(spec, call, (b.key,))
            lazy = self.collections.step(describe(spec), call, key, [(None, b)], items, b.lineage, b.gates)
            if lazy is not None:
                return lazy
            ref, extra = self.collections.computed(describe(spec), call.label, b)
            key = self.task(spec, call, (b.key,), (TaskRef(ref),), {})
            return Branch(items, key, _merge(b.lineage + extra, (key,)), b.gates)
        key = self.task(spec, call, (b.key,), (TaskRef(b.key),), {})
        return Branch(items, key, _merge(b.lineage, (key,)), b.gates)

    def _combine(self, spec: CombineSpec) -> list[Branch]:
        names = [n for n, _ in spec.inputs]
        per_input = [self.branches(s) for _, s in spec.inputs]
        out = []
        for combo in itertools.product(*per_input):
            merged: dict[str, tuple[str, tuple]] = {}
            ok = True
            for b in combo:
                for name, label, params in b.choice_items:
                    if name in merged and not self._same_choice(merged[name], (label, params)):
                        ok = False
                        break
                    merged.setdefault(name, (label, params))
                if not ok:
                    break
            if not ok:
                continue
            inputs = tuple((n, b.key) for n, b in zip(names, combo))
            lineage: tuple[str, ...] = ()
            gates: tuple[Gate, ...] = ()
            for b in combo:
                lineage = _merge(lineage, b.lineage)
                gates = _merge(gates, b.gates)
            items = tuple((n, lab, p) for n, (lab, p) in merged.items())
            refs = {n: b.key for n, b in zip(names, combo)}
            if any(b.lazy is not None for b in combo) or is_lazy_marked(spec.call.fn):  # graph/compiling/collections.py
                key = self.key(spec, spec.call, inputs)
                where = describe(spec)
                lazy = self.collections.step(where, spec.call, key, list(zip(names, combo)), items, lineage, gates)
                if lazy is not None:
                    out.append(lazy)
                    continue
                for n, b in zip(names, combo):
                    refs[n], extra = self.collections.computed(where, spec.call.label, b)
                    lineage = _merge(lineage, extra)
            kwargs = {n: TaskRef(k) for n, k in refs.items()}
            key = self.task(spec, spec.call, inputs, (), kwargs)
            out.append(Branch(items, key, _merge(lineage, (key,)), gates))
        if not out:
            raise PipelineError(
                f"{describe(spec)}: no combination of the inputs agrees on the explores they "
                "share, so nothing would run. Check that the inputs come from the same explores."
            )
        return out

    def _choose(self, spec: ChooseSpec) -> list[Branch]:
        inputs = self.branches(spec.input)
        if any(b.lazy is not None for b in inputs):  # the metric is read off the value task
            inputs = [self.collections.choose_input(describe(spec), b) for b in inputs]
        index = len(self.chooses)
        where = describe(spec)
        mkeys = []
        for b in inputs:
            if spec.prune is not None:  # the input steps wait at the rule's rungs for the run's answer
                try:
                    self.graph[b.key] = iterative_task(self.graph[b.key], spec.prune)
                except ValueError as exc:
                    raise PipelineError(f"{where}: {exc}") from None
            mk = metric_key(spec.metric, b.key)
            if mk not in self.metric_graph:
                self.metric_graph[mk] = Task(mk, extract_metric, TaskRef(b.key), shippable(spec.metric), where)
                if b.lazy is None:  # a collection's metric is a Dask scalar: read by its own task
                    self.reads.setdefault(b.key, {})[mk] = (shippable(spec.metric), where)
            mkeys.append(mk)
        self.chooses.append(ChoosePoint(index, spec, inputs, mkeys))
        return [
            Branch(b.choice_items, b.key, b.lineage, b.gates + ((index, i),), lazy=b.lazy)
            for i, b in enumerate(inputs)
        ]


def fuses_read(task: Any) -> bool:
    """Whether a choose's metric read of ``task``'s value runs inside ``task`` (one task per
    branch; ``graph.tasks.fusedmetric``) rather than as a task of its own: the one rule for which
    path a read takes.  Only a plain step's task (``graph.tasks.plainvalues.PlainStep``): an
    iterative step reports and waits at rungs under its own wrapper (which the store and the
    packing read), and a collection's value is partitions, its metric a Dask scalar.

    >>> def f(x): return {"m": x}
    >>> fuses_read(Task("a", PlainStep(f, "step", "f", source=False), 1)), fuses_read(Task("b", f, 1))
    (True, False)
    """
    return isinstance(task, Task) and isinstance(task.func, PlainStep)


def _fuse_reads(graph: dict, reads: dict[str, dict[str, tuple]]) -> dict[str, str]:
    """Wrap each step whose reads :func:`fuses_read` allows in ``ReadsMetrics`` (in ``graph``);
    returns ``{metric key: step key}`` of the fused reads."""
    fused: dict[str, str] = {}
    for key, by_mk in reads.items():
        task = graph.get(key)
        if task is None or not fuses_read(task):
            continue
        graph[key] = Task(key, ReadsMetrics(task.func, tuple((mk, m, w) for mk, (m, w) in by_mk.items())),
                          *task.args, **task.kwargs)
        fused.update({mk: key for mk in by_mk})
    return fused


def reads_for_run(compiled: CompiledPipeline, *, store: Any = None) -> CompiledPipeline:
    """``compiled`` as a run reads its metrics: fused where :func:`fuses_read` fused them,
    except in a run with a result store, where every metric is read by a task of its own
    (the steps unwrapped): the store keeps each metric under its own key, so a later run loads
    the small metric rather than the step's value. The one place a run's read path is decided.

    >>> from graph.spec import SourceSpec, ExploreSpec, ChooseSpec, Alternative, Call
    >>> def load(): return 1
    >>> def add(x, n): return {"x": x + n}
    >>> src = SourceSpec("demo", Call(load, (), "load"))
    >>> alts = tuple(Alternative("add", Call(add, (("n", n),), "add")) for n in (1, 2))
    >>> c = compile_spec(ChooseSpec(ExploreSpec(src, "n", alts), "x", "x"))
    >>> len(reads_for_run(c).fused), len(reads_for_run(c, store="results").fused)
    (2, 0)
    """
    if store is None or not compiled.fused:
        return compiled
    import dataclasses

    graph = dict(compiled.graph)
    for key in set(compiled.fused.values()):
        task = graph[key]
        graph[key] = Task(key, task.func.fn, *task.args, **task.kwargs)
    return dataclasses.replace(compiled, graph=graph, fused={})


def params_token(params: Any) -> str:
    """The deterministic token of an alternative's parameters: how the compiler tells two
    alternatives' parameters equal (``==`` on an array is no answer, and ``1 == 1.0 == True``).

    >>> import numpy as np
    >>> params_token((("a", np.array([1.0, 2.0])),)) == params_token((("a", np.array([1.0, 2.0])),))
    True
    >>> params_token((("a", 1),)) == params_token((("a", 1.0),))
    False
    """
    from dask.tokenize import tokenize

    return tokenize(params, ensure_deterministic=True)


def _lazy_branch(items: tuple, key: str, lineage: tuple, gates: tuple, lazy: Any) -> Branch:
    return Branch(items, key, lineage, gates, lazy=lazy)


def _merge(a: tuple, b: tuple) -> tuple:
    seen = set(a)
    return a + tuple(x for x in b if not (x in seen or seen.add(x)))


def dependents_of(graph: Mapping[str, Task]) -> dict[str, set[str]]:
    """``{key: keys of the tasks that read it}`` for every key of ``graph`` (one owner of the map).

    >>> def f(*a): return 0
    >>> dependents_of({"a": Task("a", f), "b": Task("b", f, TaskRef("a"))})
    {'a': {'b'}, 'b': set()}
    """
    dependents: dict[str, set[str]] = {k: set() for k in graph}
    for key, task in graph.items():
        for dep in task.dependencies:
            dependents.setdefault(dep, set()).add(key)
    return dependents


def compile_spec(spec: Spec) -> CompiledPipeline:
    """Compile the exploration ending at ``spec`` into a :class:`CompiledPipeline` (each
    function's Dask token computed once meanwhile: :mod:`graph.compiling.tokencache`)."""
    with function_tokens_once():
        return _compile_spec(spec)


def _compile_spec(spec: Spec) -> CompiledPipeline:
    c = _Compiler()
    branches = c.branches(spec)
    if any(b.lazy is not None for b in branches):  # outputs hold their partitions (graph/compiling/collections.py)
        branches = [c.collections.with_value(b, hold=True) for b in branches]
    if c._collections is not None:  # a partition's single-reader tasks fuse into their reader
        branches = c.collections.fuse(c.metric_graph, branches, c.chooses)
    fused = _fuse_reads(c.graph, c.reads)  # after the collections' fusing: it replaces tasks
    dependents = dependents_of(c.graph)
    return CompiledPipeline(
        graph=c.graph,
        metric_graph=c.metric_graph,
        branches=branches,
        chooses=c.chooses,
        output=spec,
        max_kept=max_branches(spec),
        dependents=dependents,
        size_hints=c.size_hints,
        step_of={} if c._collections is None else c._collections.step_of,
        fused=fused,
    )
