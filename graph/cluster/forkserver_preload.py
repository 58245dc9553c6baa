"""What Quiver's fork server imports as it starts (graph.cluster.workerstart), each module on its own.

The server imports this one module; it imports the modules named in the environment variable
``QUIVER_FORKSERVER_PRELOAD`` (comma-separated), each inside its own ``try``: a module that
fails there (whatever it raises) is left to the workers to import, and the server lives on.
A bare module list given to multiprocessing's ``set_forkserver_preload`` would let any error but
``ImportError`` kill the server, and Dask's nanny then waits for ever for its worker.

>>> import os
>>> os.environ[VARIABLE] = "json, no_such_module_here"
>>> preload_listed()
{'json': None, 'no_such_module_here': "ModuleNotFoundError: No module named 'no_such_module_here'"}
>>> del os.environ[VARIABLE]
"""

from __future__ import annotations

import importlib
import os

__all__ = ["VARIABLE", "preload_listed"]

VARIABLE = "QUIVER_FORKSERVER_PRELOAD"


def preload_listed() -> dict[str, str | None]:
    """Import every module ``QUIVER_FORKSERVER_PRELOAD`` names; name -> ``None`` or the error."""
    done: dict[str, str | None] = {}
    for name in filter(None, (m.strip() for m in os.environ.get(VARIABLE, "").split(","))):
        try:
            importlib.import_module(name)
            done[name] = None
        except BaseException as exc:  # recorded, never raised: the server must outlive any one module
            done[name] = f"{type(exc).__name__}: {exc}"
    return done


if os.environ.get(VARIABLE) and __name__ != "__main__":
    imported = preload_listed()
