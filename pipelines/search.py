"""The checks of ``Node.search`` (issue 47): every mistake is refused while the pipeline is built,
naming what is wrong and the fix.

>>> from pipelines import Pipeline
>>> def f(x): return {"s": x}
>>> try:
...     Pipeline("p").source(lambda: 1).then(f).search("s", n_trials=0)
... except Exception as exc:
...     print(str(exc).split(": ", 1)[1][:39])
n_trials must be a whole number >= 1, g
"""

from __future__ import annotations

import importlib.util
import numbers
from typing import Any

from graph.errors import PipelineError
from graph.spec import ChooseSpec, CombineSpec, ExploreSpec, SearchSpec, SourceSpec, Spec, StepSpec, upstream

__all__ = ["check_search", "refuse_after_search", "refuse_space_upstream", "has_space"]


def _walk(spec: Spec):
    stack, seen = [spec], set()
    while stack:
        s = stack.pop()
        if id(s) in seen:
            continue
        seen.add(id(s))
        yield s
        stack.extend(upstream(s))


def has_space(spec: Spec) -> bool:
    """Whether an explore upstream of ``spec`` has a ``space(...)`` alternative."""
    return any(isinstance(s, ExploreSpec) and any(a.space for a in s.alternatives) for s in _walk(spec))


def refuse_after_search(where: str, spec: Spec) -> None:
    """A search is the last node of its pipeline."""
    if isinstance(spec, SearchSpec):
        raise PipelineError(
            f"{where}: a search is the end of its pipeline (its value is the best trial's output); "
            "put the steps before .search(...), or run it and start a new pipeline from result.value."
        )


def refuse_space_upstream(where: str, spec: Spec) -> None:
    """A choose or a combine cannot read branches whose parameters only a sampler proposes."""
    refuse_after_search(where, spec)
    if has_space(spec):
        raise PipelineError(
            f"{where}: an explore upstream has space(...) alternatives, whose parameters only a "
            "search's sampler proposes; end the pipeline with .search(metric, n_trials=...) instead "
            "(it keeps the best trial), or list the values with grid(...)."
        )


def _optuna(where: str, what: str) -> Any:
    if importlib.util.find_spec("optuna") is None:
        raise PipelineError(
            f"{where}: {what} needs Optuna, which is not installed: pip install 'quiver[optuna]' "
            "(or pip install optuna)."
        )
    import optuna

    return optuna


def _check_optuna_part(where: str, role: str, value: Any, base: type, examples: str, judges: str,
                       study: Any) -> None:
    """A search's sampler or pruner: an instance of Optuna's ``base``, and not beside a study
    (whose own one then ``judges``)."""
    if value is None:
        return
    if study is not None:
        raise PipelineError(
            f"{where}: give a {role} or a study, not both: the study's own {judges} "
            f"(optuna.create_study({role}=..., storage=...) and pass study=)."
        )
    if not isinstance(value, base):
        raise PipelineError(f"{where}: {role} must be an Optuna {role} ({examples}), got {type(value).__name__}.")


def check_search(where: str, spec: Spec, metric: Any, mode: Any, n_trials: Any, sampler: Any, study: Any,
                 in_flight: Any, pruner: Any = None) -> None:
    """Refuse a search that cannot run, before anything runs."""
    refuse_after_search(where, spec)
    if not isinstance(metric, str) and not callable(metric):
        raise PipelineError(
            f"{where}: metric must be a key of the last step's output mapping (a string) or a callable "
            f"on the output, got {type(metric).__name__}."
        )
    if mode not in ("max", "min"):
        raise PipelineError(f"{where}: unknown mode {mode!r}; use mode='max' (higher is better) or mode='min'.")
    for name, value in (("n_trials", n_trials), ("in_flight", in_flight)):
        if value is None and name == "in_flight":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise PipelineError(
                f"{where}: {name} must be a whole number >= 1, got {value!r}."
                + (" Leave it out for one proposal per worker thread." if name == "in_flight" else "")
            )
    optuna = _optuna(where, "a search")
    for role, value, base, examples, judges in (
        ("sampler", sampler, optuna.samplers.BaseSampler, "optuna.samplers.TPESampler(seed=0), RandomSampler, "
         "CmaEsSampler, GPSampler, GridSampler...", "sampler proposes"),
        ("pruner", pruner, optuna.pruners.BasePruner, "optuna.pruners.MedianPruner(), SuccessiveHalvingPruner, "
         "HyperbandPruner...", "pruner judges the reports"),
    ):
        _check_optuna_part(where, role, value, base, examples, judges, study)
    if study is not None:
        if not isinstance(study, optuna.Study):
            raise PipelineError(
                f"{where}: study must be an optuna.Study (optuna.create_study(...) or load_study(...)), "
                f"got {type(study).__name__}."
            )
        if len(study.directions) != 1:
            raise PipelineError(
                f"{where}: the study has {len(study.directions)} objectives; a search tells one metric. "
                "Create the study with direction='maximize' or 'minimize'."
            )
        want = "MAXIMIZE" if mode == "max" else "MINIMIZE"
        if study.direction.name != want:
            other = "max" if want == "MINIMIZE" else "min"
            raise PipelineError(
                f"{where}: mode={mode!r} but the study's direction is {study.direction.name.lower()}; "
                f"pass mode={other!r}, or a study created with direction={want.lower()!r}."
            )
    searched = False
    for s in _walk(spec):
        if isinstance(s, (CombineSpec, ChooseSpec)):
            raise PipelineError(
                f"{where}: a search proposes one path through the pipeline per trial, so its pipeline "
                f"is a line of steps and explores; it has a {'combine' if isinstance(s, CombineSpec) else 'choose'} "
                "upstream. Search the part after it in a pipeline of its own (start it from the chosen value)."
            )
        if isinstance(s, (SourceSpec, StepSpec, ExploreSpec)):
            from graph.compiling.collections import is_lazy_marked

            fns = [a.call.fn for a in s.alternatives] if isinstance(s, ExploreSpec) else [s.call.fn]
            if any(is_lazy_marked(fn) for fn in fns):
                raise PipelineError(
                    f"{where}: a search runs plain steps; a lazy (Dask collection) step is upstream. "
                    "Compute the collection in the source (pipelines.eager), or use a listed explore."
                )
        if isinstance(s, ExploreSpec) and (len(s.alternatives) > 1 or any(a.space for a in s.alternatives)):
            searched = True
    if not searched:
        raise PipelineError(
            f"{where}: nothing to search: no explore upstream has two alternatives or a space(...). Add "
            "explore(name, space(fn, param=FloatDistribution(...))), or run the pipeline without .search."
        )
