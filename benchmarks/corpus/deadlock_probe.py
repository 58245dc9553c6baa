"""A Dask worker preload for ``benchmarks/step_corpus.py --trace DIR`` (a diagnostic, never
loaded by Quiver itself): when the import system detects a deadlock between two threads, it
writes every thread's stack to ``DIR/<pid>-<n>.txt`` and lets the error happen. That is how
issue 44's deadlock was traced (the task thread importing ``sklearn.preprocessing`` against
the event loop unpickling a scaler in ``gather_dep``).

It wraps the import system's own check (``importlib._bootstrap._ModuleLock.has_deadlock``, a
private name of CPython's standard library): a diagnostic for a worker started by hand, not
something to run in production.
"""
import itertools
import os
import sys
import threading
import traceback
from importlib import _bootstrap

_DIR = os.environ.get("QUIVER_TRACE_DIR", "deadlocks")
_n = itertools.count()
_check = _bootstrap._ModuleLock.has_deadlock


def _traced(self):
    found = _check(self)
    if found:
        os.makedirs(_DIR, exist_ok=True)
        names = {t.ident: t.name for t in threading.enumerate()}
        with open(os.path.join(_DIR, f"{os.getpid()}-{next(_n)}.txt"), "w") as f:
            f.write(f"deadlock on {self!r}\n")
            for tid, frame in sys._current_frames().items():
                f.write(f"\n--- thread {names.get(tid, tid)}\n")
                f.write("".join(traceback.format_stack(frame)))
    return found


_bootstrap._ModuleLock.has_deadlock = _traced
