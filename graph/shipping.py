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

__all__ = ["ByValue", "shippable"]


class ByValue:
    """A callable that pickles the function it wraps by value."""

    __slots__ = ("fn", "__name__")

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (_load, (cloudpickle.dumps(self.fn),))

    def __repr__(self) -> str:
        return f"ByValue({self.fn!r})"


def _load(blob: bytes) -> ByValue:
    return ByValue(cloudpickle.loads(blob))


def shippable(obj: Any) -> Any:
    """Wrap ``obj`` in :class:`ByValue` if its module is registered to be pickled by value."""
    if not callable(obj):
        return obj
    registry = cloudpickle.list_registry_pickle_by_value()
    module = getattr(obj, "__module__", None) or type(obj).__module__
    if module in registry:
        return ByValue(obj)
    return obj
