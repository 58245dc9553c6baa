"""Step functions for the tests, importable by worker processes.

Each value is a dict carrying ``path``: a readable identity of the work that made
it (function, parameters, inputs).  Steps given a ``log`` directory record every
execution there as one file holding that path, so tests can count executions.
"""

from __future__ import annotations

import os
import time
import uuid


def record(log: str | None, path: str) -> None:
    if log:
        with open(os.path.join(log, uuid.uuid4().hex), "w") as f:
            f.write(path)


def executions(log: str) -> list[str]:
    out = []
    for name in sorted(os.listdir(log)):
        with open(os.path.join(log, name)) as f:
            out.append(f.read())
    return out


def source(seed=0, log=None):
    path = f"source({seed})"
    record(log, path)
    return {"path": path, "x": seed}


def add(v, n, log=None):
    path = f"{v['path']}>add({n})"
    record(log, path)
    return {"path": path, "x": v["x"] + n}


def mul(v, n, log=None):
    path = f"{v['path']}>mul({n})"
    record(log, path)
    return {"path": path, "x": v["x"] * n}


def square(v, log=None):
    path = f"{v['path']}>square"
    record(log, path)
    return {"path": path, "x": v["x"] ** 2}


def join(left, right, log=None):
    path = f"join({left['path']},{right['path']})"
    record(log, path)
    return {"path": path, "x": left["x"] + right["x"]}


def fail_on(v, bad, log=None):
    path = f"{v['path']}>fail_on({bad})"
    record(log, path)
    if v["x"] == bad:
        raise ValueError(f"refusing x={bad}")
    return {"path": path, "x": v["x"]}


def always_fail(v, log=None):
    raise RuntimeError("this step always fails")


def sleep_then(v, seconds, log=None):
    time.sleep(seconds)
    path = f"{v['path']}>sleep({seconds})"
    record(log, path)
    return {"path": path, "x": v["x"]}


def not_a_mapping(v, log=None):
    return [v["x"]]


def x_mod_10(v):
    return v["x"] % 10


def mark_slow(v, log=None):
    path = f"{v['path']}>slow"
    record(log, path)
    return {"path": path, "x": v["x"] + 20, "slow": True}


def nap_if_slow(v, seconds, log=None):
    if v.get("slow"):
        time.sleep(seconds)
    path = f"{v['path']}>nap"
    record(log, path)
    return dict(v, path=path)


def fail_while(v, flag, bad):
    """Fails for x == bad while the file ``flag`` exists (a crash that a rerun no longer hits)."""
    if v["x"] == bad and os.path.exists(flag):
        raise RuntimeError(f"{flag} exists")
    return dict(v, path=f"{v['path']}>fail_while")


def with_lock(v):
    """A value that cannot be pickled (it holds a lock)."""
    import threading

    return dict(v, lock=threading.Lock())


def _charge_card(v, log, seconds):
    record(log, f"pid={os.getpid()}")
    time.sleep(seconds)
    return dict(v, charged=True)


def charge_card(v, log, seconds):
    """A step with a side effect, marked not rerunnable."""
    return _charge_card(v, log, seconds)


def _mark_not_rerunnable():
    from graph.tasks.rerun import not_rerunnable

    not_rerunnable(charge_card)


_mark_not_rerunnable()


def anything(v, **params):
    """Accepts any parameters (for grids whose parameters are generated)."""
    return dict(v, path=f"{v['path']}>anything({sorted(params)})")


def returns(v, what):
    """Returns ``what`` as the step's output, whatever it is (for choose metric errors)."""
    return what
