"""``distributed``'s configuration defaults, in ``dask.config`` from the moment Dask is imported.

Quiver imports ``distributed`` only when a run needs it (importing ``pipelines`` or ``graph``
imports no Dask at all).  Until ``distributed`` is imported, ``dask.config`` has no
``distributed`` section, and a script's

    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        node.run()

creates that section holding the one key; ``distributed``, imported inside the block by the run,
merges its defaults into it, and the block's exit removes the whole section again (Dask takes
back what its ``set`` inserted).  The run's kept cluster (:mod:`graph.cluster.embedded`) then fails on its
next read of its configuration (``KeyError: 'distributed'`` from every comm), and so does the
next run.  With ``distributed``'s defaults registered first, Dask's ``set`` records the
replacement of that one key and its exit puts the default back, as it does in a script that
imported ``distributed`` itself.

:func:`install` registers them as soon as ``dask.config`` is imported (at once when it already
is): ``distributed``'s own ``distributed.yaml``, parsed without importing ``distributed``
(a few ms); ``distributed``'s import later merges the same defaults again, which changes nothing.

>>> import dask.config
>>> install()
>>> dask.config.get("distributed.comm.timeouts.connect") is not None
True
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["install", "register"]

logger = logging.getLogger(__name__)
_CONFIG = "dask.config"


def register(config: ModuleType) -> None:
    """Merge ``distributed.yaml``'s defaults into ``config`` (the ``dask.config`` module) as
    ``distributed`` does on import; nothing when ``distributed`` is not installed or its file
    cannot be read (``distributed``'s own import then reports it)."""
    try:
        import yaml  # dask.config's own dependency: already imported with it

        spec = importlib.util.find_spec("distributed")  # finds the package, does not import it
        if spec is None or spec.origin is None:
            return
        path = os.path.join(os.path.dirname(spec.origin), "distributed.yaml")
        with open(path) as f:
            defaults = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if isinstance(defaults, dict):
            config.update_defaults(defaults)
    except Exception as exc:  # logged: the defaults then come with distributed's import, as without Quiver
        logger.debug("quiver: distributed's config defaults were not registered early (%s: %s)",
                     type(exc).__name__, exc)


class _AfterImport(importlib.abc.Loader):
    """Runs ``dask.config``'s own loader, then :func:`register`; the module keeps its own loader."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if getattr(module, "__loader__", None) is self:  # as if this wrapper had never been there
            module.__loader__ = self.loader
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__.loader = self.loader
        register(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of ``dask.config`` it takes the spec the other
    finders give and wraps its loader (:class:`_AfterImport`), then leaves ``sys.meta_path``."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _CONFIG:
            return None
        _uninstall()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterImport(spec.loader)
        return spec


_FINDER = _Finder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Register ``distributed``'s defaults now when ``dask.config`` is imported, else as soon
    as it is (once per process)."""
    config = sys.modules.get(_CONFIG)
    if config is not None and hasattr(config, "update_defaults"):
        _uninstall()
        if "distributed" not in sys.modules:  # imported: its defaults are in already
            register(config)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
