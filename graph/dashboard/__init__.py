"""Quiver's pages in the Dask dashboard: the scheduler plugin, its Bokeh pages, and the event protocol.

* :mod:`graph.dashboard.protocol`: the Dask event topics a run publishes on, the branch statuses,
  and the client-side publishers (no Bokeh, no scheduler needed);
* :mod:`graph.dashboard.plugin`: :class:`QuiverDashboard`, the ``SchedulerPlugin`` that keeps each
  run's branch states and training curves from those events, and the JSON endpoint;
* :mod:`graph.dashboard.pages`: the ``/quiver-exploration`` and ``/quiver-training`` Bokeh pages.

Imports run ``pages -> protocol`` and ``plugin -> protocol`` (``plugin`` loads ``pages`` only when a
scheduler has a Bokeh dashboard to add them to). A scheduler preloads it with Dask's own CLI::

    dask scheduler --preload graph.dashboard

>>> from graph.dashboard import PLUGIN_NAME, STATUSES
>>> PLUGIN_NAME, STATUSES[:3]
('quiver-dashboard', ('waiting', 'running', 'done'))
"""

from __future__ import annotations

from .plugin import QuiverDashboard, dask_setup, ensure_dashboard, install_pages, dashboard_snapshot
from .protocol import (
    COLORS,
    EXPLORATION_PAGE,
    EXPLORATION_TOPIC,
    JSON_PATH,
    PLUGIN_NAME,
    STATUSES,
    TRAINING_PAGE,
    TRAINING_TOPIC,
)

__all__ = [
    "COLORS",
    "EXPLORATION_PAGE",
    "EXPLORATION_TOPIC",
    "JSON_PATH",
    "PLUGIN_NAME",
    "QuiverDashboard",
    "STATUSES",
    "TRAINING_PAGE",
    "TRAINING_TOPIC",
    "dask_setup",
    "ensure_dashboard",
    "install_pages",
    "dashboard_snapshot",
]
