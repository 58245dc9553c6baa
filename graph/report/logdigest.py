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

import logging
import threading
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ..keys import step_name

__all__ = ["ComputeFailedDigest", "ErrorDigestPlugin"]

logger = logging.getLogger("distributed.worker")


class ComputeFailedDigest(logging.Filter):
    """Pass the first ``Compute Failed`` record of each (step, exception) as one line; count the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, str], int] = {}
        self.reported: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()

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


class ErrorDigestPlugin(WorkerPlugin):
    """Install a :class:`ComputeFailedDigest` on a worker; log its counts every ``interval`` seconds."""

    name = "quiver-error-digest"

    def __init__(self, interval: float = 2.0):
        self.interval = interval
        self.digest: ComputeFailedDigest | None = None
        self._callback: Any = None

    def setup(self, worker: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.digest = ComputeFailedDigest()
        logger.addFilter(self.digest)
        self._callback = PeriodicCallback(self._flush, self.interval * 1000)
        self._callback.start()

    def _flush(self) -> None:
        if self.digest is not None:
            for line in self.digest.flush():
                logger.error(line)

    def teardown(self, worker: Any) -> None:
        if self._callback is not None:
            self._callback.stop()
        self._flush()
        if self.digest is not None:
            logger.removeFilter(self.digest)
            self.digest = None
