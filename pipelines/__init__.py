"""Quiver's builder API: explore alternatives, choose the best, run it all as one Dask graph.

Importing ``pipelines`` does not import Dask.

>>> from pipelines import Pipeline, grid
>>> def load(): return [3, 1, 2]
>>> def sort(xs, reverse): return {"first": sorted(xs, reverse=reverse)[0]}
>>> best = Pipeline("demo").source(load).explore("order", grid(sort, reverse=[False, True])).choose("first")
>>> best.compile().unique_tasks
3
"""

from graph.errors import PipelineError, RunError

from .alternatives import grid
from .builder import Node, Pipeline, combine
from .collections import eager, lazy
from .pruning import halving
from .result import Result
from .searchresult import SearchResult
from .space import space

__all__ = ["Pipeline", "Node", "grid", "space", "combine", "halving", "Result", "SearchResult", "lazy", "eager", "PipelineError", "RunError", "from_sklearn"]


def __getattr__(name: str):
    if name == "from_sklearn":  # imports scikit-learn (and Dask): only when asked for
        from .sklearn import from_sklearn

        return from_sklearn
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
