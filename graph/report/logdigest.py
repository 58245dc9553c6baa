"""Group repeated identical task errors in a worker's log into one line with a count.

Dask logs every failed task as a multi-line ``Compute Failed`` block (key, task, exception,
traceback) on its worker.  An exploration whose steps fail the same way in every branch
prints dozens of identical blocks, though Quiver's table already holds each branch's error
and traceback.  :class:`ComputeFailedDigest` (a ``logging.Filter`` on ``distributed.worker``)
lets the first failure of each kind (step, exception) through as one line and counts the
others; :class:`ErrorDigestPlugin` installs it on each worker of the embedded cluster and
logs the counts as one line per kind every few seconds and when the worker closes.

>>> import logging
>>> d = ComputeFailedDigest()
>>> def rec(key, exc):
...     return logging.LogRecord("distributed.worker", logging.ERROR, "", 0,
...         "Compute Failed\\nKey:       %s\\nState:     %s\\nTask:  %s\\nException: %r\\nTraceback: %r\\n",
...         (key, "executing", "<Task>", exc, "  File ..."), None)
>>> r = rec("fit-1a2b", "ValueError('bad')")
>>> d.filter(r), r.getMessage()
(True, "Compute Failed: step 'fit' raised ValueError('bad') (key fit-1a2b); identical failures are counted, not logged; every branch's error and traceback are in Quiver's table")
>>> d.filter(rec("fit-3c4d", "ValueError('bad')")), d.filter(rec("fit-5e6f", "KeyError('x')"))
(False, True)
>>> d.flush()
["step 'fit' raised ValueError('bad') 1 more time(s) (2 in all; the first logged above)"]
>>> d.flush()
[]
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ..keys import step_name

__all__ = ["ComputeFailedDigest", "ErrorDigestPlugin", "WarningDigest", "dask_logs", "digested_dask_logs"]

logger = logging.getLogger("distributed.worker")


class _Counted(logging.Filter):
    """A filter that counts records by kind: ``counts`` (seen), ``reported`` (said so far)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, str], int] = {}
        self.reported: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()


class ComputeFailedDigest(_Counted):
    """Pass the first ``Compute Failed`` record of each (step, exception) as one line; count the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Compute Failed") and record.args):
            return True
        try:
            key, _state, _task, exc = record.args[:4]
        except (TypeError, ValueError):
            return True
        step = step_name(key)  # a partition key ("<layer>-<token>", i) names its layer
        kind = (step, repr(exc) if not isinstance(exc, str) else exc)
        with self.lock:
            n = self.counts.get(kind, 0) + 1
            self.counts[kind] = n
            if n > 1:
                return False
            self.reported[kind] = 1
        record.msg = (
            f"Compute Failed: step {step!r} raised {kind[1]} (key {key}); identical failures are counted, "
            "not logged; every branch's error and traceback are in Quiver's table"
        )
        record.args = ()
        return True

    def flush(self) -> list[str]:
        """One line per kind that failed again since the last flush."""
        lines = []
        with self.lock:
            for kind, n in self.counts.items():
                if n > self.reported.get(kind, 0):
                    lines.append(f"step {kind[0]!r} raised {kind[1]} {n - 1} more time(s) ({n} in all; the first logged above)")
                    self.reported[kind] = n
        return lines


class WarningDigest(_Counted):
    """A filter for the handlers of Dask's ``distributed`` logger: the first record of each kind
    (its logger and message template) passes, the same again is counted, and :meth:`flush` gives
    one line per kind that came again (issue 44: Dask's own warnings shown once, summarised).

    >>> d = WarningDigest()
    >>> def rec(n):
    ...     return logging.LogRecord("distributed.worker.memory", logging.WARNING, "", 0,
    ...                              "Unmanaged memory use is high (%d MiB)", (n,), None)
    >>> [d.filter(rec(n)) for n in (700, 710, 720)]
    [True, False, False]
    >>> d.flush()
    ["distributed.worker.memory: 'Unmanaged memory use is high (%d MiB)' 2 more time(s) (3 in all; the first shown above)"]
    >>> d.flush(), d.filter(logging.LogRecord("distributed.core", logging.INFO, "", 0, "fine", (), None))
    ([], True)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith("distributed"):
            return True
        kind = (record.name, str(record.msg).splitlines()[0] if record.msg else "")
        with self.lock:
            n = self.counts[kind] = self.counts.get(kind, 0) + 1
            if n == 1:
                self.reported[kind] = 1
            return n == 1

    def flush(self) -> list[str]:
        """One line per kind that came again since the last flush."""
        lines = []
        with self.lock:
            for kind, n in self.counts.items():
                if n > self.reported.get(kind, 0):
                    lines.append(f"{kind[0]}: {kind[1]!r} {n - self.reported[kind]} more time(s) ({n} in all; "
                                 "the first shown above)")
                    self.reported[kind] = n
        return lines


def dask_logs() -> str:
    """``"summary"`` (the default: Dask's warnings once each, repeats counted) or ``"all"`` (every
    record as Dask logs it; ``quiver run --verbose``): dask config ``quiver.dask-logs``."""
    import dask

    value = dask.config.get("quiver.dask-logs", default="summary")
    if value not in ("summary", "all"):
        raise ValueError(f"dask config quiver.dask-logs must be 'summary' or 'all', got {value!r}: "
                         "e.g. dask.config.set({'quiver.dask-logs': 'all'}) to see every Dask log line")
    return value


def _handlers() -> list[logging.Handler]:
    return [h for name in ("distributed", "") for h in logging.getLogger(name).handlers]


@contextlib.contextmanager
def digested_dask_logs() -> Iterator[WarningDigest | None]:
    """While open, this process's Dask warnings are shown once each (a :class:`WarningDigest` on the
    handlers of the ``distributed`` logger and the root); at the close one line per repeated kind.
    Nothing changes when :func:`dask_logs` is ``"all"``."""
    if dask_logs() == "all":
        yield None
        return
    digest = WarningDigest()
    handlers = _handlers()
    for h in handlers:
        h.addFilter(digest)
    try:
        yield digest
    finally:
        for h in handlers:
            h.removeFilter(digest)
        for line in digest.flush():
            logging.getLogger("distributed").warning("%s", line)


class ErrorDigestPlugin(WorkerPlugin):
    """Install a :class:`ComputeFailedDigest` on a worker; log its counts every ``interval`` seconds."""

    name = "quiver-error-digest"

    def __init__(self, interval: float = 2.0, summary: bool = True):
        self.interval = interval
        self.summary = summary  # dask_logs() == "summary" in the client's process
        self.warnings: WarningDigest | None = None
        self.digest: ComputeFailedDigest | None = None
        self._callback: Any = None

    def setup(self, worker: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.digest = ComputeFailedDigest()
        logger.addFilter(self.digest)
        self.warnings = WarningDigest() if self.summary else None  # Dask's own warnings on this worker, once each
        for h in _handlers() if self.warnings is not None else ():
            h.addFilter(self.warnings)
        self._callback = PeriodicCallback(self._flush, self.interval * 1000)
        self._callback.start()

    def _flush(self) -> None:
        if self.digest is not None:
            for line in self.digest.flush():
                logger.error(line)
        if self.warnings is not None:
            for line in self.warnings.flush():
                logger.warning(line)

    def teardown(self, worker: Any) -> None:
        if self._callback is not None:
            self._callback.stop()
        self._flush()
        if self.digest is not None:
            logger.removeFilter(self.digest)
            self.digest = None
        if self.warnings is not None:
            for h in _handlers():
                h.removeFilter(self.warnings)
            self.warnings = None
