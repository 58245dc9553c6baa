"""Scheduler plugins that live for one run: registered before the run submits anything, removed
when it ends, on every path, each wait bounded, and what the plugin did read back as it goes.

``graph.run.sharedcopies`` (copies of training inputs) and ``graph.run.spread`` (ready tasks where they
start first) are such plugins: a head start for the run, never a reason for it to fail. A
subclass of :class:`RunPlugin` says what it did in :meth:`RunPlugin.outcome`.

>>> class Counting(RunPlugin):
...     def outcome(self):
...         return 0
>>> Counting("quiver-demo").name
'quiver-demo'
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from ..bounded import within

__all__ = ["RunPlugin", "install", "plugin_name", "remove"]

logger = logging.getLogger(__name__)

try:  # the plugins' base class; modules with pure rules beside their plugin import without distributed
    from distributed.diagnostics.plugin import SchedulerPlugin as _Base
except ImportError:  # pragma: no cover - distributed is a dependency of every run
    _Base = object


class RunPlugin(_Base):
    """A ``SchedulerPlugin`` for one run, named ``name``; :meth:`outcome` is what :func:`remove`
    returns (read on the scheduler in the event that removes the plugin)."""

    def __init__(self, name: str):
        self.name = name
        self._scheduler = None

    async def start(self, scheduler) -> None:
        self._scheduler = scheduler

    def outcome(self) -> Any:
        raise NotImplementedError


def plugin_name(kind: str) -> str:
    """A name unique to one run's plugin of this ``kind``.

    >>> plugin_name("quiver-copies").startswith("quiver-copies-")
    True
    """
    return f"{kind}-{uuid.uuid4().hex[:12]}"


def install(client: Any, plugin: RunPlugin, timeout: float, what: str) -> str | None:
    """Register ``plugin`` on ``client``'s scheduler, waiting ``timeout`` s at most; returns its
    name, or ``None`` when the scheduler did not take it in time (logged, and removed should it
    arrive late: the run goes on without it). ``what``: the plugin's job, for the log."""
    deadline = time.monotonic() + timeout
    try:
        within(deadline, client.register_plugin, plugin, what=f"installing {what}")
    except Exception as exc:  # recorded: the plugin is only a head start, a run never fails for it
        logger.info("quiver: %s not installed (%s: %s)", what, type(exc).__name__, exc)
        remove(client, plugin.name, None, timeout, what)  # registered late, after the wait gave up: do not leave it
        return None
    return plugin.name


def remove(client: Any, name: str | None, default: Any, timeout: float, what: str) -> Any:
    """Unregister the plugin ``name`` (waiting ``timeout`` s at most in all); returns its
    :meth:`RunPlugin.outcome`, or ``default`` when nothing was installed or the scheduler did not say."""
    if name is None:
        return default
    deadline = time.monotonic() + timeout
    try:
        out = within(deadline, client.run_on_scheduler, _remove_on_scheduler, name=name, what=f"removing {what}")
    except Exception as exc:  # recorded: a silent or gone scheduler keeps what it did not take
        logger.info("quiver: %s: %s", type(exc).__name__, exc)
        return default
    return default if out is None else out


def _remove_on_scheduler(dask_scheduler, name: str) -> Any:
    """On the scheduler, in one event: the plugin ``name``'s outcome, and the plugin removed."""
    plugin = dask_scheduler.plugins.get(name)
    if plugin is None:
        return None
    dask_scheduler.remove_plugin(name=name)
    return plugin.outcome()
