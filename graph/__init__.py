"""Compile an exploration into one Dask graph, run it, and report what happened.

``graph`` owns the plain description of an exploration (``graph.spec``) that
``pipelines`` builds; it never imports the builder.  Importing ``graph`` does not
import Dask: the compiler and executor load on first use.

>>> import graph
>>> sorted(graph.__all__)[:3]
['Branch', 'CompiledPipeline', 'MemoryPlan']
"""

from __future__ import annotations

import importlib
from typing import Any

from .daskdefaults import install as _install_dask_defaults
from .errors import PipelineError, RunError

_install_dask_defaults()  # distributed's config defaults, as soon as Dask is imported (graph.daskdefaults)

__all__ = [
    "Branch",
    "CompiledPipeline",
    "MemoryPlan",
    "PipelineError",
    "QuiverDashboard",
    "RunError",
    "RunRecord",
    "compile",
    "connect",
    "execute",
    "plan_memory",
    "ResultStore",
    "not_rerunnable",
    "close_kept",
    "tune_workers",
]

_LAZY = {
    "Branch": "graph.compiling.compiler",
    "CompiledPipeline": "graph.compiling.compiler",
    "RunRecord": "graph.run.executor",
    "execute": ("graph.run.session", "run_compiled"),  # the one run path: everything Node.run gets
    "connect": "graph.cluster.connect",
    "QuiverDashboard": "graph.dashboard",
    "MemoryPlan": "graph.memory.plan",
    "plan_memory": "graph.memory.plan",
    "ResultStore": "graph.tasks.store",
    "not_rerunnable": "graph.tasks.rerun",
    "close_kept": "graph.cluster.embedded",
    "tune_workers": "graph.cluster.workerenv",
}


def compile(node: Any):  # noqa: A001 - the contract name (docs/architecture.md §3)
    """Compile a pipeline node (or a ``graph.spec`` value) into a ``CompiledPipeline``.

    >>> from pipelines import Pipeline, grid
    >>> def load(): return 2
    >>> def power(x, p): return x ** p
    >>> c = compile(Pipeline("demo").source(load).explore("power", grid(power, p=[1, 2])))
    >>> c.unique_tasks, c.naive_tasks
    (3, 4)
    """
    from .compiling.compiler import compile_spec
    from .spec import ChooseSpec, CombineSpec, ExploreSpec, SearchSpec, SourceSpec, StepSpec

    spec = getattr(node, "spec", node)
    if not isinstance(spec, (SourceSpec, StepSpec, ExploreSpec, CombineSpec, ChooseSpec, SearchSpec)):
        raise PipelineError(
            f"graph.compile: expected a pipeline node (pipelines.Node) or a graph.spec value, got "
            f"{type(node).__name__}. Build one with pipelines.Pipeline(name).source(fn)."
        )
    from .keys import identities_remembered

    with identities_remembered():
        return compile_spec(spec)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        where = _LAZY[name]
        module, attr = where if isinstance(where, tuple) else (where, name)
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'graph' has no attribute {name!r}")
