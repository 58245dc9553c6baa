"""Waits with a bound: a run never blocks where it cannot see an abort (docs/architecture.md §4).

Every Client call that asks the scheduler something waits for its answer, and Dask gives most
of them no timeout: once the scheduler stops answering (stopped, overloaded, a dead link that
TCP has not noticed), the calling thread waits for ever.  A run's thread therefore never makes
such a call itself: it hands the call to a helper thread (:func:`in_thread`) and waits for it
with :func:`wait`, which gives up when the run is being aborted (``interrupted()``, e.g. the
watchdog's verdict) or after ``timeout`` seconds.  A call given up leaves its helper thread
blocked (a daemon thread: it ends when the connection does); the run goes on to end.

>>> wait(in_thread(lambda: sum([1, 2, 3])), what="a sum", timeout=5)
6
>>> import threading
>>> try:
...     wait(in_thread(threading.Event().wait), what="the scheduler's answer", timeout=0.1)
... except NoAnswer as exc:
...     print(exc)
the scheduler's answer: none within 0.1 s
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CLEANUP_SECONDS", "SETUP_SECONDS", "Interrupted", "NoAnswer", "answered", "in_thread", "wait", "within"]

#: the most a run's clean-up waits for the scheduler, all its calls together
CLEANUP_SECONDS = 10.0
#: the most one set-up call of a run (a plugin's registration, counting the workers' threads)
#: waits for the scheduler before the run ends with a RunError saying which call
SETUP_SECONDS = 60.0


class NoAnswer(TimeoutError):
    """A call did not return within the time it was given."""


class Interrupted(Exception):
    """A wait was given up because the run is being aborted (``interrupted()`` said so)."""


def in_thread(call: Callable[[], Any], name: str = "quiver-call") -> concurrent.futures.Future:
    """Start ``call()`` on a daemon thread of its own; its outcome as a future."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def target() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(call())
        except BaseException as exc:  # handed to the waiter, which re-raises it
            fut.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return fut


def wait(
    fut: concurrent.futures.Future,
    *,
    what: str,
    timeout: float | None = None,
    interrupted: Callable[[], bool] | None = None,
    poll: float = 0.2,
) -> Any:
    """``fut``'s result; raises :class:`NoAnswer` after ``timeout`` seconds (``None``: no limit)
    and :class:`Interrupted` as soon as ``interrupted()`` is true (checked every ``poll`` s)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
        try:
            return fut.result(timeout=step)
        except concurrent.futures.TimeoutError:
            pass
        if interrupted is not None and interrupted():
            fut.cancel()
            raise Interrupted(what)
        if deadline is not None and time.monotonic() >= deadline:
            fut.cancel()
            raise NoAnswer(f"{what}: none within {timeout:g} s")


def within(deadline: float, fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """Call ``fn`` on a helper thread and wait for it until ``deadline`` (``time.monotonic()``);
    raises :class:`NoAnswer` when the deadline has passed (without calling ``fn``) or passes."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise NoAnswer(f"{what}: skipped, the time for it has run out")
    return wait(in_thread(functools.partial(fn, *args, **kwargs), f"quiver-{what}"), what=what, timeout=left)


def answered(fn: Callable[..., Any], *args: Any, what: str, timeout: float = SETUP_SECONDS, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a set-up call to the scheduler, waited for ``timeout`` s at most;
    no answer by then ends the run with a :class:`graph.errors.RunError` that says which call.

    >>> answered(sum, [1, 2], what="a sum")
    3
    """
    try:
        return within(time.monotonic() + timeout, fn, *args, what=what, **kwargs)
    except NoAnswer as exc:
        from .errors import RunError

        raise RunError(f"{what}: the scheduler did not answer within {timeout:g} s; is it running, "
                       f"reachable and not overloaded? (the run had not started: nothing is lost)") from exc
