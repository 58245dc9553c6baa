"""Steps that must not run twice: Dask recomputes the keys a dead worker held, so steps must be
idempotent; a step marked :func:`not_rerunnable` fails its branch with :class:`RerunRefused`
instead of running a second time in the same run (a cluster-wide ``distributed.Event``).

>>> @not_rerunnable
... def send_mail(result):
...     return result
>>> is_rerun_safe(send_mail), is_rerun_safe(len)
(False, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..keys import step_name
from ..wrappers import layers

__all__ = ["RerunRefused", "RunOnce", "is_rerun_safe", "not_rerunnable", "once_name"]


class RerunRefused(RuntimeError):
    """A step marked :func:`not_rerunnable` was about to run a second time after a worker loss."""


def not_rerunnable(fn: Callable) -> Callable:
    """Mark a step function as unsafe to run twice (it sends mail, appends to a file, ...).

    Dask recomputes a task whose worker died.  A step marked here instead fails its
    branch with :class:`RerunRefused` (other branches are unaffected), so its side effect
    happens at most once per run.  The marker is a function attribute; the function is
    returned unchanged.

    >>> @not_rerunnable
    ... def send_report(result):
    ...     return result
    >>> is_rerun_safe(send_report), is_rerun_safe(len)
    (False, True)
    """
    try:
        fn.__quiver_rerun_safe__ = False
    except (AttributeError, TypeError):
        raise TypeError(
            f"not_rerunnable: cannot mark {fn!r}; decorate a plain Python function"
        ) from None
    return fn


def is_rerun_safe(fn: Callable) -> bool:
    """``False`` for a step marked :func:`not_rerunnable` (also through ``ByValue``/store wrappers)."""
    return all(getattr(f, "__quiver_rerun_safe__", True) is not False for f in layers(fn))


def once_name(run_id: str, key: str) -> str:
    """The name of the cluster-wide event that marks ``key`` as started in run ``run_id``."""
    return f"quiver-once-{run_id}-{key}"


class RunOnce:
    """Refuses to start a step a second time in one run (a cluster-wide ``distributed.Event``)."""

    def __init__(self, fn: Callable, key: str, run_id: str):
        self.fn, self.key, self.run_id = fn, key, run_id
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from distributed import Event

        started = Event(once_name(self.run_id, self.key))
        if started.is_set():
            raise RerunRefused(
                f"step {step_name(self.key)!r} (key {self.key!r}) already started once in this "
                "run and its worker was lost; it is marked not_rerunnable, so its branch fails "
                "instead of running it again. Make the step idempotent, or rerun the exploration."
            )
        started.set()
        return self.fn(*args, **kwargs)
