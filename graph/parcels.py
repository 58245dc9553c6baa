"""A step's value travels as a parcel and is unpickled on the thread of the task that uses it.

Why (issue 44): a worker unpickles what it fetches from another worker on its event loop
(or its offload thread). Unpickling a scikit-learn scaler imports
``sklearn.preprocessing._data`` there; if a task thread is at that moment running a step that
does ``from sklearn.preprocessing import RobustScaler`` for the first time, the two threads take
the import system's module locks in opposite orders (the task thread holds
``sklearn.preprocessing`` and wants ``._data``; the event loop holds ``._data`` and wants its
parent), and Python raises ``_DeadlockError`` in one of them. Traced on fresh ``dask worker``
processes (``benchmarks/step_corpus.py --trace DIR``): the task thread inside ``robust`` against
the event loop in ``gather_dep`` -> ``pickle.loads`` of a ``StandardScaler`` fetched from the
other worker, in every one of 6 runs. Quiver met it more than plain Dask because of its spread
(``graph.run.spread``: a ready task whose inputs' worker is busy may start on another worker,
so scaled data, scaler included, travels while the other scalers' steps import): on the commit
before this module, 3 fresh CLI runs each, ``quiver.spread-ready: False`` lost no branch, while
``quiver.shared-copies: False`` or ``quiver.warmup: False`` lost the ``robust`` branches in 3 of 3.

The cure removes the second thread: a step's value is wrapped in a :class:`Parcel`, which
pickles its value into opaque frames when it leaves its worker (to a peer, to disk, to the
client), and is unpickled by :meth:`Parcel.open`, which the consuming step calls on its own
task thread. The event loop then only ever unpickles Quiver's own small class and the frames.
Imports the step's value needs happen on the thread that runs the user's code, one after the
other, whatever the step's body imports and whatever the libraries import lazily.

A parcel also checks, on the producing task's thread, that its value can be pickled at all
(on workers in another process than the client), so a value that cannot travel fails its own
step with :class:`ValueCannotTravel` naming the step and the type, instead of failing inside
Dask's transfer or the client's gather with no step named.

>>> p = Parcel({"accuracy": 0.9})
>>> opened(p)
{'accuracy': 0.9}
>>> import pickle
>>> q = pickle.loads(pickle.dumps(p, protocol=5))   # what a peer or the client receives
>>> q.is_open(), opened(q), q.is_open()
(False, {'accuracy': 0.9}, True)
>>> opened(3), opened([Parcel(1), 2])                 # anything else is itself
(3, [Parcel(1), 2])
"""

from __future__ import annotations

import logging
import pickle
import sys
import time
from typing import Any

import cloudpickle

__all__ = ["Parcel", "ValueCannotTravel", "opened", "opened_args", "parcel", "retrying", "is_import_deadlock",
           "IMPORT_DEADLOCK_ATTEMPTS", "RETRY_TOPIC", "retries_by_key", "set_client_process"]

logger = logging.getLogger(__name__)

#: how often a step is tried when the import system raised its deadlock error (another thread of
#: the worker was importing the same package): the first try's error released its locks, so the
#: second finds the package imported (or imports it alone)
IMPORT_DEADLOCK_ATTEMPTS = 3

#: set in the process that holds the run's client: workers there (``processes=False``, the
#: bridge) share the client's memory, so their values are never pickled and need no check
_client_process = False


def set_client_process() -> None:
    """Mark this process as the client's (its values never travel through pickle)."""
    global _client_process
    _client_process = True


class ValueCannotTravel(TypeError):
    """A step's value cannot be pickled, so it cannot leave the worker that made it."""


#: the address a received buffer must start at (numpy's own allocations are aligned so)
ALIGNMENT = 16


def _aligned(buffer: Any) -> Any:
    """``buffer``, or an aligned copy of it when it starts at an address that is not a multiple of
    :data:`ALIGNMENT`. A value's buffers arrive from another worker as slices of the frames Dask
    received, at any byte offset, and a numpy array unpickled on one at an odd address is
    *unaligned*: every ufunc and BLAS call on it then takes numpy's slow, buffered path. Measured
    (issue 47's benchmark, 2 workers): a ``LogisticRegression`` fit on a fetched 16,000 x 200 table
    took 9.2 s at offset 41 against 0.9 s on an aligned copy of it. One copy per parcel, when it is
    opened (a memcpy), restores the speed.

    >>> import numpy as np
    >>> raw = bytearray(8 * 4 + 1)
    >>> odd = memoryview(raw)[1:]
    >>> np.frombuffer(_aligned(odd), dtype=np.uint8).ctypes.data % ALIGNMENT
    0
    """
    import numpy as np

    try:
        view = np.frombuffer(buffer, dtype=np.uint8)
    except (TypeError, ValueError):  # not a plain contiguous buffer: left to pickle as it is
        return buffer
    if view.ctypes.data % ALIGNMENT == 0:
        return buffer
    out = np.empty(view.shape, dtype=np.uint8)
    out[...] = view
    return out


def _loads(head: bytes, buffers: tuple) -> Any:
    return pickle.loads(head, buffers=tuple(_aligned(b) for b in buffers))


class Parcel:
    """A step's value: itself on the worker that made it, opaque frames anywhere else until
    :meth:`open` (on the consuming task's thread) unpickles them.

    ``label`` names the step in the error raised when the value cannot be pickled."""

    __slots__ = ("_value", "_frames", "label")

    def __init__(self, value: Any, label: str = "") -> None:
        self._value = value
        self._frames: tuple | None = None
        self.label = label

    @classmethod
    def _received(cls, label: str, head: bytes, *buffers: Any) -> "Parcel":
        p = cls.__new__(cls)
        p._value, p._frames, p.label = None, (head, buffers), label
        return p

    def is_open(self) -> bool:
        return self._frames is None

    def open(self) -> Any:
        """The value (unpickled here, on the calling thread, the first time)."""
        frames = self._frames
        if frames is not None:
            self._value = retrying(_loads, *frames)
            self._frames = None
        return self._value

    def check(self) -> "Parcel":
        """Raise :class:`ValueCannotTravel` if the value cannot be pickled (no-op in the client's process)."""
        if not _client_process and self._frames is None:
            self._pickled(5)
        return self

    def _pickled(self, protocol: int) -> tuple:
        if self._frames is not None:
            return self._frames
        buffers: list = []
        try:
            if protocol >= 5:
                head = cloudpickle.dumps(self._value, protocol=5, buffer_callback=buffers.append)
            else:
                head = cloudpickle.dumps(self._value, protocol=protocol)
        except Exception as exc:  # re-raised naming the step: pickling a user's value may raise anything
            what = f"step {self.label}" if self.label else "a step"
            raise ValueCannotTravel(
                f"{what} returned {_culprit(self._value)} that cannot be "
                f"pickled ({type(exc).__name__}: {exc}), so it cannot leave the worker that made it (to another "
                "worker, to disk or to you). Return picklable values: keep locks, open files, sockets, "
                "generators and threads inside the step, or give the object __getstate__/__setstate__."
            ) from exc
        return head, tuple(buffers)

    def __reduce_ex__(self, protocol: int):
        head, buffers = self._pickled(protocol)
        return (Parcel._received, (self.label, head, *buffers))

    def __sizeof__(self) -> int:
        if self._frames is not None:
            head, buffers = self._frames
            return len(head) + sum(memoryview(b).nbytes for b in buffers)
        from dask.sizeof import sizeof

        return sizeof(self._value)

    def __repr__(self) -> str:
        return f"Parcel({self._value!r})" if self._frames is None else "Parcel(<unopened>)"


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _culprit(value: Any) -> str:
    """What in ``value`` cannot be pickled: the first entry of a mapping or sequence that cannot,
    else the value itself (e.g. "a dict whose entry 'lock' (a _thread.lock)").

    >>> import threading
    >>> _culprit({"a": 1, "lock": threading.Lock()}), _culprit(threading.Lock())
    ("a dict whose entry 'lock' (a _thread.lock)", 'a _thread.lock')
    """
    entries = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, v in entries:
        try:
            cloudpickle.dumps(v)
        except Exception as exc:  # recorded: this entry is the culprit the message names
            logger.debug("quiver: entry %r of a step's value cannot be pickled: %s", k, exc)
            return f"a {_type_name(value)} whose entry {k!r} (a {_type_name(v)})"
    return f"a {_type_name(value)}"


def parcel(value: Any, label: str = "") -> Any:
    """``value`` as a checked :class:`Parcel` in a Dask task (a value that is already one is left
    as it is); outside a task (a step called directly) ``value`` itself.

    >>> parcel({"m": 1})
    {'m': 1}
    """
    if isinstance(value, Parcel):
        return value
    from gpu.worker import current_task

    if current_task() is None:
        return value
    return Parcel(value, label).check()


def opened(value: Any) -> Any:
    """``value``'s content if it is a :class:`Parcel`, else ``value``."""
    return value.open() if isinstance(value, Parcel) else value


def opened_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A task's arguments with every parcel among them (and in a list, tuple or dict argument:
    ``combine``'s inputs) opened, on the calling thread."""
    return (tuple(_open_in(a) for a in args), {k: _open_in(v) for k, v in kwargs.items()})


def _open_in(value: Any) -> Any:
    if isinstance(value, Parcel):
        return value.open()
    if type(value) in (list, tuple) and any(isinstance(v, Parcel) for v in value):
        return type(value)(opened(v) for v in value)
    if type(value) is dict and any(isinstance(v, Parcel) for v in value.values()):
        return {k: opened(v) for k, v in value.items()}
    return value


def is_import_deadlock(exc: BaseException) -> bool:
    """``exc`` is the import system's ``_DeadlockError`` (two threads importing one package
    in opposite orders), here or as the cause of an ``ImportError``.

    >>> is_import_deadlock(RuntimeError("x")), is_import_deadlock(_deadlock_type()("deadlock detected"))
    (False, True)
    """
    kind = _deadlock_type()
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, kind):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _deadlock_type() -> type:
    # CPython keeps the class in importlib._bootstrap (a private module of the standard library,
    # stable since 3.3); every Python this project supports has it
    return sys.modules["importlib._bootstrap"]._DeadlockError


def retrying(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, called again (at most :data:`IMPORT_DEADLOCK_ATTEMPTS` times in
    all) when it raised the import system's deadlock error: an infrastructure error (another
    thread of the worker was importing the same package), never the step's own. The tries it
    took are counted in :data:`deadlock_retries` of this process."""
    for attempt in range(1, IMPORT_DEADLOCK_ATTEMPTS + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # re-raised unless it is the import system's deadlock (an infrastructure error)
            if attempt == IMPORT_DEADLOCK_ATTEMPTS or not is_import_deadlock(exc):
                raise
            _note_retry(getattr(fn, "__name__", type(fn).__name__), f"{type(exc).__name__}: {exc}")
            time.sleep(0.01 * attempt)  # the other thread finishes the import it holds
    raise AssertionError("unreachable")


#: (the callable, the error) of every retry after an import deadlock, in this process
deadlock_retries: list[tuple[str, str]] = []

#: the worker event topic a retry is told on (``Client.get_events(RETRY_TOPIC)``): the run
#: counts them per task key (``result.stats["infrastructure_retries"]``, the table's ``retries``)
RETRY_TOPIC = "quiver-retries"


def _note_retry(name: str, error: str) -> None:
    deadlock_retries.append((name, error))
    from gpu.worker import current_task, current_worker

    worker = current_worker()
    key = current_task() if worker is not None else None
    if key is not None:
        worker.log_event(RETRY_TOPIC, {"key": key, "step": name, "error": error})


def retries_by_key(events: list) -> dict[str, int]:
    """Count the retries per task key in ``Client.get_events(RETRY_TOPIC)``'s ``(time, msg)`` pairs.

    >>> retries_by_key([(0.0, {"key": "a", "step": "f", "error": "x"}), (1.0, {"key": "a"}), (2.0, "?")])
    {'a': 2}
    """
    counts: dict[str, int] = {}
    for _, msg in events:
        if isinstance(msg, dict) and isinstance(msg.get("key"), str):
            counts[msg["key"]] = counts.get(msg["key"], 0) + 1
    return counts
