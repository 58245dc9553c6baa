"""Ship step functions to workers that cannot import them.

``distributed`` pickles a whole graph at once and honours
``cloudpickle.register_pickle_by_value`` only for objects it sees directly, so a
function from a module registered by value (``quiver run FILE`` registers the
file's module) would reach the workers as an import they cannot do.  Such
functions are wrapped in :class:`ByValue`, which always pickles its function
with cloudpickle, by value.

>>> import math
>>> shippable(math.sqrt) is math.sqrt       # importable everywhere: left alone
True
"""

from __future__ import annotations

from typing import Any

import cloudpickle

__all__ = ["ByValue", "shippable", "check_picklable"]


class ByValue:
    """A callable that pickles the function it wraps by value.

    Where it arrives it stays bytes until first called (or its ``fn`` read): the function's
    unpickling, and the imports its globals need, happen on the task's thread, not on the
    worker's event loop beside a running task's imports (``graph.parcels``).

    >>> import pickle
    >>> f = pickle.loads(pickle.dumps(ByValue(abs)))
    >>> f.__name__, f(-2)
    ('abs', 2)
    """

    __slots__ = ("_fn", "_blob", "__name__")

    def __init__(self, fn):
        self._fn, self._blob = fn, None
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    @property
    def fn(self) -> Any:
        if self._blob is not None:
            from ..parcels import retrying

            self._fn, self._blob = retrying(cloudpickle.loads, self._blob), None
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (_load, (self._blob if self._blob is not None else cloudpickle.dumps(self._fn), self.__name__))

    def __repr__(self) -> str:
        return f"ByValue({self.__name__})" if self._blob is not None else f"ByValue({self._fn!r})"


def _load(blob: bytes, name: str = "") -> ByValue:
    f = ByValue.__new__(ByValue)
    f._fn, f._blob, f.__name__ = None, blob, name
    return f


def shippable(obj: Any) -> Any:
    """Wrap ``obj`` in :class:`ByValue` if its module is registered to be pickled by value."""
    if not callable(obj):
        return obj
    registry = cloudpickle.list_registry_pickle_by_value()
    module = getattr(obj, "__module__", None) or type(obj).__module__
    if module in registry:
        return ByValue(obj)
    return obj


def check_picklable(graph: dict, where: str = "") -> None:
    """Raise ``PipelineError`` naming the step and parameter if a task cannot be pickled
    to be sent to the workers (checked before anything is submitted, so nothing half-runs).

    >>> from dask.task_spec import Task
    >>> import threading
    >>> check_picklable({"f-1": Task("f-1", max, 1, n=2)})
    >>> check_picklable({"f-1": Task("f-1", max, 1, n=threading.Lock())})
    Traceback (most recent call last):
        ...
    graph.errors.PipelineError: step 'f' (key 'f-1'): parameter 'n' (lock) cannot be pickled ...
    """
    from dask.task_spec import DataNode, TaskRef

    from ..keys import step_name

    from ..errors import PipelineError

    seen: set[int] = set()
    for key, task in graph.items():
        items = [("the step function", getattr(task, "func", None))]
        items += [(f"argument #{i + 1}", a) for i, a in enumerate(getattr(task, "args", ()))]
        items += [(f"parameter {k!r}", v) for k, v in getattr(task, "kwargs", {}).items()]
        for what, obj in items:
            if isinstance(obj, DataNode):
                obj = obj.value
            if obj is None or isinstance(obj, (TaskRef, str, bytes, int, float, bool)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            try:
                cloudpickle.dumps(obj)
            except Exception as exc:  # re-raised as a PipelineError naming the step: pickling may raise anything
                raise PipelineError(
                    f"{where}step {step_name(str(key))!r} (key {key!r}): {what} "
                    f"({type(obj).__name__}) cannot be pickled to send it to the workers "
                    f"({type(exc).__name__}: {exc}). Pass something picklable (plain values, "
                    "arrays, dataclasses), or create the object inside the step from plain parameters."
                ) from None
