"""scikit-learn's configuration at ``fit``, carried to the steps on the workers.

``sklearn.set_config`` / ``sklearn.config_context`` are per thread of one process: a worker
does not see what the caller set (``enable_metadata_routing=True``, ``transform_output=
"pandas"``, ``assume_finite``, ...).  The search captures the configuration when ``fit``
starts (:func:`captured`) and every step runs inside it (:func:`applied`).

>>> import sklearn
>>> with sklearn.config_context(assume_finite=True):
...     cfg = captured()
>>> cfg["assume_finite"], sklearn.get_config()["assume_finite"]
(True, False)
>>> with applied(cfg):
...     sklearn.get_config()["assume_finite"]
True
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

__all__ = ["captured", "applied"]


def _settable() -> set[str]:
    from sklearn import config_context

    return {p.name for p in inspect.signature(config_context).parameters.values() if p.kind is p.KEYWORD_ONLY}


def captured() -> dict:
    """The settings in force here, those ``config_context`` can set, as a plain dict (sorted)."""
    from sklearn import get_config

    keys = _settable()
    return {k: v for k, v in sorted(get_config().items()) if k in keys}


@contextlib.contextmanager
def applied(config: dict | None) -> Iterator[None]:
    """Run the block under ``config`` (``None``: as it is)."""
    if not config:
        yield
        return
    from sklearn import config_context

    with config_context(**config):
        yield
