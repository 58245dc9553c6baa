"""Plain steps whose value turns out to be a Dask collection: refused at the first one.

A *plain* step (or a source not marked ``pipelines.lazy``) runs as one task on a worker. If it
returns a ``dask.dataframe``/``dask.array`` collection, a Dask scalar or a ``Delayed``, that
collection's graph never joins the exploration's: every later step gets the unevaluated
collection, nothing is shared per partition, and a choose finally reads a Dask object instead
of a number. :class:`PlainStep` wraps such a step's function in its task and raises
:class:`CollectionValueError` at the first such value, naming the step and the fix
(docs/architecture.md §8; docs/guide/collections.md).

>>> step = PlainStep(lambda x: {"m": x + 1}, "pipeline 'p', explore('m')", "inc", source=False)
>>> step(1)            # in a Dask task its value is a parcel (graph.parcels), opened where it is used
{'m': 2}
>>> import dask
>>> step = PlainStep(lambda: dask.delayed(sum)([1, 2]), "pipeline 'p', source(load)", "load", source=True)
>>> step()
Traceback (most recent call last):
    ...
graph.tasks.plainvalues.CollectionValueError: pipeline 'p', source(load): the source load returned a Dask Delayed, a lazy collection, ... @pipelines.lazy ...
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..parcels import opened_args, parcel, retrying

__all__ = ["PlainStep", "CollectionValueError", "collection_in"]


class CollectionValueError(TypeError):
    """A plain step (or a source not marked ``pipelines.lazy``) returned a Dask collection."""


def collection_in(value: Any) -> str | None:
    """Where a Dask collection sits in ``value`` (``value`` itself, or an entry of a mapping,
    list or tuple), e.g. ``"a Dask Scalar in its entry 'm'"``; ``None`` when there is none.

    >>> collection_in({"m": 1.0}) is None
    True
    """
    if "dask" not in sys.modules:  # nothing can be a Dask collection; never import Dask for it
        return None
    from dask.base import is_dask_collection

    if is_dask_collection(value):
        return f"a Dask {type(value).__name__}"
    if isinstance(value, Mapping):
        entries = value.items()
    elif isinstance(value, (list, tuple)):
        entries = enumerate(value)
    else:
        return None
    for k, v in entries:
        if is_dask_collection(v):
            return f"a Dask {type(v).__name__} in its entry {k!r}"
    return None


class PlainStep:
    """A plain step's function, refusing a value that holds a Dask collection.

    Its inputs are opened (``graph.parcels``) and its value returned as a parcel, so whatever
    the values need to import is imported on the task's thread; an import deadlock with
    another of the worker's threads is retried (``graph.parcels.retrying``).

    ``fn`` stays reachable as ``.fn`` (``graph.tasks.rerun`` and ``graph.report.tracebacks`` look through it)."""

    __slots__ = ("fn", "where", "label", "source", "__name__")

    def __init__(self, fn: Any, where: str, label: str, *, source: bool) -> None:
        self.fn = fn
        self.where = where
        self.label = label
        self.source = source
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = opened_args(args, kwargs)  # the inputs unpickle here, on the task's thread
        value = retrying(self.fn, *args, **kwargs)
        found = collection_in(value)
        if found is not None:
            raise CollectionValueError(self.message(found))
        return parcel(value, self.label)

    def message(self, found: str) -> str:
        if self.source:
            return (
                f"{self.where}: the source {self.label} returned {found}, a lazy collection, as a plain "
                "value. A source not marked lazy runs as one task on a worker, so the collection's "
                "partitions never join the exploration's graph: every step would get the unevaluated "
                "collection and a choose would read a Dask object instead of a number. Mark the source "
                "@pipelines.lazy (it is then called on the client while compiling and its partitions "
                "become tasks every branch shares; see docs/guide/collections.md), or return a "
                "computed value (.compute()) if it fits in one worker."
            )
        return (
            f"{self.where}: step {self.label} returned {found} as a plain value: its input was not a "
            "Dask collection, so it ran as one task on a worker and the collection's graph never "
            "joins the exploration's (nothing of it would run, or be shared). Return computed values "
            "(.compute(), float(...)), or make the collection in a source marked @pipelines.lazy so "
            "that the steps on it become collection steps (docs/guide/collections.md)."
        )

    def __reduce__(self):
        return (_rebuild, (self.fn, self.where, self.label, self.source))

    def __repr__(self) -> str:
        return f"PlainStep({self.fn!r})"


def _rebuild(fn: Any, where: str, label: str, source: bool) -> PlainStep:
    return PlainStep(fn, where, label, source=source)
