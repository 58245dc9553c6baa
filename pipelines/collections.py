"""Mark steps for Dask collections (docs/architecture.md §8).

``lazy(fn)``: ``fn`` builds or transforms a Dask collection (``dask.dataframe``,
``dask.array``); it is applied on the client when the pipeline compiles and its graph
becomes part of the exploration's. A *source* must be marked to be a collection source;
a step whose inputs are collections is tried lazily without a mark (see
``graph.compiling.collections``), so mark it only to insist. ``eager(fn)``: ``fn`` is a plain step
even on collection inputs: it runs on a worker on the computed value.

>>> from pipelines import Pipeline
>>> def read(path): ...
>>> Pipeline("big").source(lazy(read), path="data/")    # doctest: +ELLIPSIS
<Node pipeline 'big', source(read): ...>
"""

from __future__ import annotations

from collections.abc import Callable

from graph.compiling.collections import mark_lazy

__all__ = ["lazy", "eager"]


def lazy(fn: Callable) -> Callable:
    """``fn`` as a collection step (usable as a decorator); ``fn`` itself is not changed."""
    return mark_lazy(fn, True)


def eager(fn: Callable) -> Callable:
    """``fn`` as a plain step: on a collection input it gets the computed value on one worker."""
    return mark_lazy(fn, False)
