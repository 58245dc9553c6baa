"""Quiver's own switches in Dask's config (``quiver.*``): each read one way.

A switch is a boolean dask config value whose default is ``True``; anything but ``True`` or
``False`` is an error that names the key and says how to set it. A foundation module of
``graph``: the cluster layer (the bridge) and the run (the spread) both read their switches here.
"""

from __future__ import annotations

__all__ = ["config_flag"]


def config_flag(name: str, meaning: str) -> bool:
    """The boolean dask config ``name`` (default ``True``, ``meaning`` what ``True`` does); any
    other value is an error that names it and says how to set it.

    >>> config_flag("quiver.no-such-flag", "an example")
    True
    """
    import dask

    value = dask.config.get(name, default=True)
    if not isinstance(value, bool):
        raise ValueError(f"dask config {name} must be True or False (True: {meaning}), got {value!r}: "
                         f"e.g. dask.config.set({{'{name}': False}}) to turn it off")
    return value
