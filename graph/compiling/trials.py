"""A search's proposals, one at a time: the space a sampler sees, and a proposal compiled to tasks.

:class:`SearchSpace` reads a search's pipeline (``graph.spec.SearchSpec``: a line of steps and
explores) as the questions a sampler answers for one trial: at each explore with several
alternatives, which one (a categorical parameter named after the explore, its choices the
alternatives' labels); then the distributions of the alternative taken (``space(...)``:
conditional parameters, named ``"<explore>.<param>"``, or ``"<explore>.<choice>.<param>"`` when
two alternatives of the explore share a parameter's name). :func:`compile_proposal` compiles the
branch a trial took with the compiler every run uses (``compile_spec``), so a step with the same
function, parameters and input has the same key as in any other proposal or listed run: what
another proposal already computed, or is computing, is the same task (docs/architecture.md §3).
Nothing here imports Optuna: a trial is any object with Optuna's ``suggest_*`` methods.

>>> from graph.spec import SourceSpec, ExploreSpec, SearchSpec, Alternative, Call
>>> def load(): return 1
>>> def add(x, n): return {"v": x + n}
>>> def mul(x, n): return {"v": x * n}
>>> src = SourceSpec("demo", Call(load, (), "load"))
>>> alts = (Alternative("add", Call(add, (("n", 1),), "add")), Alternative("mul", Call(mul, (("n", 3),), "mul")))
>>> space = SearchSpace(SearchSpec(ExploreSpec(src, "op", alts), "v", "v"))
>>> space.names()
{'op': ('add', 'mul')}
>>> class Trial:                      # what a sampler would answer
...     def suggest_categorical(self, name, choices): return choices[1]
>>> p = compile_proposal(space.suggest(Trial()))
>>> p.choices, [k.split("-")[0] for k in p.path], p.metric.split("-")[0]
({'op': ('mul', {'n': 3})}, ['load', 'mul'], 'metric')

``SearchSpec(..., param_names="plain")`` names a space's parameters by their own names (the
study then uses the names a drop-in's user gave, ``pipelines.sklearn.OptunaSearchCV``'s
``"clf__C"``); two questions of one name are refused:

>>> class Dist:                       # stands for an optuna FloatDistribution
...     low, high, step, log = 0.0, 1.0, None, False
>>> FloatDistribution = type("FloatDistribution", (Dist,), {})
>>> one = (Alternative("add", Call(add, (), "add"), space=(("n", FloatDistribution()),)),)
>>> list(SearchSpace(SearchSpec(ExploreSpec(src, "op", one), "v", "v", param_names="plain")).names())
['n']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import PipelineError
from ..spec import Alternative, Call, ChooseSpec, ExploreSpec, SearchSpec, SourceSpec, Spec, StepSpec, describe
from .compiler import compile_spec

__all__ = ["SearchSpace", "Proposal", "CompiledProposal", "compile_proposal", "suggest", "common_keys"]


def _kind(dist: Any) -> str:
    names = {cls.__name__ for cls in type(dist).__mro__}
    for kind in ("FloatDistribution", "IntDistribution", "CategoricalDistribution"):
        if kind in names:
            return kind
    raise PipelineError(f"a search space takes Float, Int or Categorical distributions, got {type(dist).__name__}")


def suggest(trial: Any, name: str, dist: Any) -> Any:
    """Ask ``trial`` for parameter ``name`` of distribution ``dist`` through Optuna's public
    ``suggest_*`` methods (any sampler then sees the same distribution).

    >>> class D: pass
    >>> suggest(None, "x", D())
    Traceback (most recent call last):
    ...
    graph.errors.PipelineError: a search space takes Float, Int or Categorical distributions, got D
    """
    kind = _kind(dist)
    if kind == "FloatDistribution":
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if kind == "IntDistribution":
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_categorical(name, dist.choices)


@dataclass(frozen=True)
class _Explore:
    spec: ExploreSpec
    choices: tuple[str, ...]  # one name per alternative
    #: per alternative: ((parameter, the sampler's name for it, distribution), ...)
    params: tuple[tuple[tuple[str, str, Any], ...], ...]


@dataclass(frozen=True)
class Proposal:
    """One trial's branch: the pipeline narrowed to the alternatives and values it took (a
    ``ChooseSpec`` over a line with one alternative per explore) and its choices for the table."""

    spec: ChooseSpec
    choices: dict


@dataclass(frozen=True)
class CompiledProposal:
    """A proposal's tasks: ``tasks`` (key -> ``Task``: its steps), ``path`` (its step keys,
    inputs first), ``metric`` (the read's key) and ``read`` (the read's own task), ``fused``
    (the last step reads the metric itself and sends it: ``graph.tasks.fusedmetric``; the read
    task runs only if that message never comes) and ``choices``."""

    tasks: dict
    path: tuple[str, ...]
    metric: str
    read: Any
    fused: bool
    choices: dict


class SearchSpace:
    """The questions a search's sampler answers for each trial (module docstring)."""

    def __init__(self, search: SearchSpec):
        self.search = search
        line: list[Spec] = []
        s: Spec = search.input
        while not isinstance(s, SourceSpec):
            if not isinstance(s, (StepSpec, ExploreSpec)):
                raise PipelineError(f"{describe(s)}: a search's pipeline is a line of steps and explores")
            line.append(s)
            s = s.input
        self.source = s
        self.line = list(reversed(line))
        plain = self._plain(search)
        self.explores = {e.name: self._explore(e, plain) for e in self.line if isinstance(e, ExploreSpec)}
        if plain:
            self._refuse_shared_names()

    @property
    def iterative(self) -> bool:
        """Whether a trial's last step may be iterative (a generator step, whose reports the
        study's pruner judges: ``graph.state.proposals``)."""
        from ..tasks.iterative import is_iterative

        last = self.line[-1] if self.line else self.source
        fns = [a.call.fn for a in last.alternatives] if isinstance(last, ExploreSpec) else [last.call.fn]
        return any(is_iterative(f) for f in fns)

    @staticmethod
    def _plain(search: SearchSpec) -> bool:
        names = getattr(search, "param_names", "qualified")
        if names not in ("qualified", "plain"):
            raise PipelineError(f"a search's param_names is 'qualified' or 'plain', got {names!r}")
        return names == "plain"

    def _refuse_shared_names(self) -> None:
        """With plain names, two questions of one name would be one parameter to the sampler."""
        seen: dict[str, str] = {}
        for name, ex in self.explores.items():
            asked = ([name] if len(ex.choices) > 1 else []) + [s for params in ex.params for _, s, _ in params]
            for sname in asked:
                if sname in seen:
                    raise PipelineError(
                        f"a search with param_names='plain' asks the sampler {sname!r} twice (explores "
                        f"{seen[sname]!r} and {name!r}); rename one parameter or explore, or use "
                        "param_names='qualified' (\"<explore>.<param>\")."
                    )
                seen[sname] = name

    @staticmethod
    def _explore(e: ExploreSpec, plain: bool = False) -> _Explore:
        labels = [a.label for a in e.alternatives]
        choices = []
        for a in e.alternatives:
            if labels.count(a.label) > 1:  # a grid's points: the label and the values
                choices.append(f"{a.label}({', '.join(f'{k}={v!r}' for k, v in a.call.params)})")
            else:
                choices.append(a.label)
        counts: dict[str, int] = {}
        for a in e.alternatives:
            for n, _ in a.space:
                counts[n] = counts.get(n, 0) + 1
        params = tuple(
            tuple((n, n if plain else f"{e.name}.{n}" if counts[n] == 1 else f"{e.name}.{c}.{n}", d)
                  for n, d in a.space)
            for a, c in zip(e.alternatives, choices)
        )
        return _Explore(e, tuple(choices), params)

    def names(self) -> dict[str, Any]:
        """Every parameter a trial may be asked, by the name the sampler (and the study) sees:
        a categorical's choices, or the distribution (for ``GridSampler``'s ``search_space``, the
        dashboard, ``study.trials_dataframe()``)."""
        out: dict[str, Any] = {}
        for name, ex in self.explores.items():
            if len(ex.choices) > 1:
                out[name] = ex.choices
            for params in ex.params:
                for _, sname, dist in params:
                    out[sname] = dist
        return out

    def suggest(self, trial: Any) -> Proposal:
        """Ask ``trial`` for one branch (in pipeline order: an explore's alternative, then its
        distributions) and return it as a :class:`Proposal`."""
        prev: Spec = self.source
        choices: dict[str, tuple[str, dict]] = {}
        for s in self.line:
            if isinstance(s, StepSpec):
                prev = StepSpec(prev, s.call)
                continue
            ex = self.explores[s.name]
            i = 0 if len(ex.choices) == 1 else ex.choices.index(trial.suggest_categorical(s.name, list(ex.choices)))
            alt = s.alternatives[i]
            values = tuple((n, suggest(trial, sname, d)) for n, sname, d in ex.params[i])
            call = Call(alt.call.fn, alt.call.params + values, alt.call.label, alt.call.size_hint)
            prev = ExploreSpec(prev, s.name, (Alternative(alt.label, call),))
            choices[s.name] = (alt.label, dict(call.params))
        search = self.search
        return Proposal(ChooseSpec(prev, search.metric, search.metric_name, search.mode), choices)


class _FirstAnswers:
    """A trial that answers every question with its first choice or its lower bound: the
    branch :func:`common_keys` compiles without asking a sampler (no study trial is made)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return list(choices)[0]

    def suggest_float(self, name: str, low: float, high: float, step: Any = None, log: bool = False) -> float:
        return low

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return low


def common_keys(space: SearchSpace) -> tuple[str, ...]:
    """The step keys every proposal of ``space`` reads, inputs first: the source and the steps
    before the first explore that asks the sampler anything (several alternatives, or a
    distribution). Each trial's branch starts with these same keys (same step, parameters and
    input), so their results are inputs shared by all the trials (``graph.run.adaptive`` copies
    them to every worker the moment they exist).

    >>> from graph.spec import SourceSpec, StepSpec, ExploreSpec, SearchSpec, Alternative, Call
    >>> def load(): return 1
    >>> def prep(x): return x
    >>> def fit(x, n): return {"v": x + n}
    >>> line = StepSpec(SourceSpec("demo", Call(load, (), "load")), Call(prep, (), "prep"))
    >>> alts = (Alternative("fit", Call(fit, (("n", 1),), "fit")), Alternative("fit2", Call(fit, (("n", 2),), "fit")))
    >>> [k.split("-")[0] for k in common_keys(SearchSpace(SearchSpec(ExploreSpec(line, "m", alts), "v", "v")))]
    ['load', 'prep']
    """
    fixed = 0
    for s in space.line:
        if isinstance(s, ExploreSpec):
            ex = space.explores[s.name]
            if len(ex.choices) > 1 or any(ex.params[0]):
                break
        fixed += 1
    path = compile_proposal(space.suggest(_FirstAnswers())).path
    return path[: 1 + fixed]


def compile_proposal(proposal: Proposal) -> CompiledProposal:
    """Compile ``proposal``'s branch with the compiler every run uses: keys equal another
    proposal's (or a listed run's) for the same step, parameters and input. Where the compiler
    fuses the metric read into the last step (``graph.compiling.compiler.fuses_read``: a plain
    step), the step sends its metric as it ends: one task per trial, no read to wait for."""
    c = compile_spec(proposal.spec)
    [branch] = c.branches
    metric = c.chooses[0].metric_keys[0]
    return CompiledProposal(dict(c.graph), tuple(branch.lineage), metric, c.metric_graph[metric],
                            metric in c.fused, proposal.choices)
