"""The result store: a directory holding one pickled result per task key (docs/architecture.md §4).

Opt-in (``node.run(store="results/")`` or ``quiver run FILE --store DIR``). Keys are
deterministic tokens of (function identity *including a digest of its code*, parameters,
input keys), see ``graph.keys``, so a file is valid for exactly the work that made it.
Files are written with cloudpickle to a temporary file then ``os.replace``d (readers never
see half a file; two workers writing the same key write the same bytes); values that
cannot be pickled are not stored (a ``StoreWarning`` on the worker). Which tasks load
and which save is the graph transform's job (:mod:`graph.compiling.transform`).

The directory must be visible at the same path to the client and every worker: any
local directory for one host, a shared filesystem (NFS, Lustre, ...) across hosts.

>>> import tempfile
>>> store = ResultStore(tempfile.mkdtemp())
>>> store.save("add-1234", {"x": 1})
True
>>> "add-1234" in store, store.load("add-1234")
(True, {'x': 1})
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from typing import Any

import cloudpickle

__all__ = ["ResultStore", "StoreError", "StoreWarning", "load_stored", "write_result"]


class StoreError(RuntimeError):
    """A stored result could not be read back."""


class StoreWarning(UserWarning):
    """A result could not be stored (it is still used by the run)."""


class ResultStore:
    """A directory holding one pickled result per task key.

    >>> import tempfile
    >>> s = ResultStore(tempfile.mkdtemp())
    >>> s.file("fit<x>-ab12").endswith("fit_x_-ab12.pkl")
    True
    >>> len(s)
    0
    """

    SUFFIX = ".pkl"

    def __init__(self, path: str | os.PathLike):
        if isinstance(path, ResultStore):
            path = path.path
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"store must be a directory path, got {type(path).__name__} {path!r}")
        self.path = os.path.abspath(os.fspath(path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"store {self.path!r} exists and is not a directory")
        os.makedirs(self.path, exist_ok=True)

    def __repr__(self) -> str:
        return f"ResultStore({self.path!r})"

    def file(self, key: str) -> str:
        """The file that holds ``key``'s result."""
        return os.path.join(self.path, re.sub(r"[^A-Za-z0-9_.-]", "_", str(key)) + self.SUFFIX)

    def __contains__(self, key: str) -> bool:
        return os.path.isfile(self.file(key))

    def __len__(self) -> int:
        return sum(1 for n in os.listdir(self.path) if n.endswith(self.SUFFIX))

    def load(self, key: str) -> Any:
        return load_stored(self.file(key), key)

    def save(self, key: str, value: Any) -> bool:
        """Store ``value`` under ``key``; ``False`` (with a warning) if it cannot be pickled or written."""
        return write_result(self.file(key), key, value)


def load_stored(path: str, key: str) -> Any:
    """Read ``key``'s stored result from ``path`` (a ``StoreError`` naming the file to delete if it cannot)."""
    try:
        with open(path, "rb") as f:
            return cloudpickle.load(f)
    except Exception as exc:  # re-raised as a StoreError naming the file: unpickling may raise anything
        raise StoreError(
            f"result store: cannot load {key!r} from {path} ({type(exc).__name__}: {exc}). "
            "Delete that file (or the store directory) and run again to recompute it."
        ) from exc


def write_result(path: str, key: str, value: Any) -> bool:
    """Write ``value`` to ``path`` atomically; ``False`` (with a ``StoreWarning``) if it cannot be pickled or written."""
    try:
        blob = cloudpickle.dumps(value, protocol=5)
    except Exception as exc:  # recorded (a StoreWarning): pickling a user's value may raise anything
        warnings.warn(
            f"result store: not saving {key!r}: its value ({type(value).__name__}) cannot be pickled "
            f"({type(exc).__name__}: {exc}); it will be recomputed next time",
            StoreWarning,
            stacklevel=2,
        )
        return False
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the old file, the new one, or none
        return True
    except OSError as exc:
        warnings.warn(f"result store: could not write {key!r} to {path}: {exc}", StoreWarning, stacklevel=2)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
