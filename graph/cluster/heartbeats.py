"""A worker's last heartbeat ends before it closes: no traceback in the user's output.

Dask's ``Worker.close`` stops the worker's periodic callbacks and, a few awaits later, closes
its connection pool.  A heartbeat already under way (the callback is a coroutine: it gathers
metrics, then connects to the scheduler) that reaches the pool after that logs "Unexpected
exception during heartbeat. Closing worker." with two tracebacks.  It is a race: CI saw it
once in a kept cluster's close at a script's exit (``tests/test_cluster_reuse.py``).

:func:`track` wraps a worker's heartbeat callback so that the beat in flight is known, and
:func:`stop` stops the heartbeat and waits for that beat to end.  :class:`QuietClosePlugin`
(a Dask worker plugin, installed on each worker of an embedded cluster) does both: Dask runs a
plugin's ``teardown`` in ``Worker.close`` before it stops the callbacks and closes the pool.
The bridge worker (:mod:`graph.cluster.bridge`) uses the same two functions before it retires.

>>> import asyncio
>>> class Beats:  # a stand-in with what a Dask worker has: periodic_callbacks
...     def __init__(self):
...         from tornado.ioloop import PeriodicCallback
...         self.beats = 0
...         self.periodic_callbacks = {"heartbeat": PeriodicCallback(self.heartbeat, 1000)}
...     async def heartbeat(self):
...         await asyncio.sleep(0.05)
...         self.beats += 1
>>> async def demo():
...     w = Beats()
...     track(w)
...     beat = asyncio.ensure_future(w.periodic_callbacks["heartbeat"].callback())  # one in flight
...     await asyncio.sleep(0)
...     await stop(w, timeout=1.0)  # returns once it ended
...     return w.beats, await w.periodic_callbacks["heartbeat"].callback()  # none after the stop
>>> asyncio.run(demo())
(1, None)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["QuietClosePlugin", "stop", "track"]

logger = logging.getLogger(__name__)

#: seconds a closing worker waits at most for its heartbeat in flight (a beat is milliseconds)
STOP_TIMEOUT = 5.0


class _Beat:
    """The tracked heartbeat of one worker: the original callback, and whether a beat runs."""

    def __init__(self, callback: Any):
        self.callback = callback
        self.stopped = False
        self.idle: asyncio.Event | None = None  # made on the worker's loop, at the first beat

    async def __call__(self) -> None:
        if self.stopped:
            return
        if self.idle is None:
            self.idle = asyncio.Event()
        self.idle.clear()
        try:
            result = self.callback()
            if result is not None:
                await result
        finally:
            self.idle.set()


def track(worker: Any) -> None:
    """Wrap ``worker``'s heartbeat callback so that :func:`stop` can wait for the beat in flight
    (idempotent; a worker without a heartbeat is left as it is)."""
    pc = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
    if pc is not None and not isinstance(pc.callback, _Beat):
        pc.callback = _Beat(pc.callback)


async def stop(worker: Any, timeout: float = STOP_TIMEOUT) -> None:
    """Stop ``worker``'s heartbeat for good and wait (``timeout`` s at most) for the beat in flight."""
    pc = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
    if pc is None:
        return
    pc.stop()
    beat = pc.callback
    if not isinstance(beat, _Beat):
        return
    beat.stopped = True
    if beat.idle is not None and not beat.idle.is_set():
        try:
            await asyncio.wait_for(beat.idle.wait(), timeout)
        except asyncio.TimeoutError:  # logged: the close goes on; Dask may log the late beat
            logger.debug("quiver: a worker's last heartbeat did not end within %.1f s", timeout)


class QuietClosePlugin(WorkerPlugin):
    """Track each worker's heartbeat (:func:`track`) and let the beat in flight end before the
    worker closes (:func:`stop`, in the plugin's teardown)."""

    name = "quiver-quiet-close"

    def setup(self, worker: Any) -> None:
        track(worker)

    async def teardown(self, worker: Any) -> None:
        await stop(worker)
