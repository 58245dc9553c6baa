"""A search's ``client=`` argument: passed by reference by ``clone``, pickled as its scheduler address.

Shared by every drop-in search (:mod:`.search`, :mod:`.optunasearch`): a ``distributed.Client``
holds a connection, which can be neither deep-copied nor pickled.

>>> _scheduler_address("tcp://127.0.0.1:8786") is None      # an address is kept as it is
True
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["ClientParam"]


def _scheduler_address(client: Any) -> str | None:
    """The scheduler address of a ``distributed.Client`` (``None`` for anything else)."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    if not isinstance(client, Client):
        return None
    return client.scheduler.address


class ClientParam:
    """Mixed into a scikit-learn estimator with a ``client`` parameter (before the estimator's class)."""

    def __sklearn_clone__(self):
        """``sklearn.base.clone``: scikit-learn's own clone, except that ``client`` is the same
        object in the clone (a ``Client`` holds a connection: it cannot be deep-copied, and the
        clone should run on the same cluster)."""
        proxy = copy.copy(self)  # shallow: self is left as it is (another thread may be using it)
        proxy.client = None
        new = super(ClientParam, proxy).__sklearn_clone__()
        new.client = self.client
        return new

    def __getstate__(self):
        """Pickle as scikit-learn does; a ``Client`` given as ``client`` is pickled as its
        scheduler address (a connection cannot be pickled), so the unpickled search runs on the
        same scheduler if it is still there, and predicts without it."""
        state = dict(super().__getstate__())
        address = _scheduler_address(state.get("client"))
        if address is not None:
            state["client"] = address
        return state
