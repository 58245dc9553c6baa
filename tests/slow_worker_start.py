"""A Dask worker preload for tests/test_bridge.py: the cluster's own workers register only after
``SECONDS``, so a bridge test does not depend on how fast two workers start on a busy machine.

The bridge (a worker in the test's own process, named :data:`graph.cluster.bridge.NAME`) is not delayed.
"""

from __future__ import annotations

import time

SECONDS = 3.0


def dask_setup(worker) -> None:
    from graph.cluster.bridge import NAME

    if worker.name != NAME:
        time.sleep(SECONDS)
