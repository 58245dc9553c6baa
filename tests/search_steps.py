"""Step functions for the adaptive search's tests (tests/test_adaptive.py), importable by workers.

Each step records every execution in ``log`` (one file each, ``tests.steps.record``), so a test
counts what really ran."""

from __future__ import annotations

from tests.steps import record


def load(log=None):
    record(log, "load")
    return {"x": 1.0}


def double(v, log=None):
    record(log, "double")
    return {"x": 2 * v["x"]}


def negate(v, log=None):
    record(log, "negate")
    return {"x": -v["x"]}


def fit(v, a, log=None):
    record(log, f"fit({a!r})")
    return {"score": -(v["x"] - a) ** 2, "a": a}


def fragile(v, a, log=None):
    """Fails above 0.5: a failed trial among good ones."""
    record(log, f"fragile({a!r})")
    if a > 0.5:
        raise ValueError(f"a={a} is too large")
    return {"score": a}


def pruned(v, a, log=None):
    """Asks Optuna to prune the trial above 0.5."""
    import optuna

    record(log, f"pruned({a!r})")
    if a > 0.5:
        raise optuna.TrialPruned(f"a={a}")
    return {"score": a}


def width(v, n, log=None):
    record(log, f"width({n})")
    return {"score": float(n) + v["x"]}


def sleepy(v, a, log=None):
    import time

    record(log, f"sleepy({a!r})")
    time.sleep(1.0)
    return {"score": a}


def deep(v, depth, log=None):
    record(log, f"deep({depth})")
    return {"score": float(depth)}


def epochs(v, lr, log=None):
    """An iterative (generator) step as a search's last step: without a pruner its reports prune
    nothing, its return value is the trial's."""
    record(log, f"epochs({lr!r})")
    acc = 0.0
    for _ in range(3):
        acc += lr
        yield {"score": acc}
    return {"score": acc}


def curve(v, rate, n=8, log=None, seconds=0.3):
    """An iterative step training ``n`` "epochs": its score climbs towards ``rate``, so a low rate
    is behind from its first report. Records each epoch executed (``curve(rate)@epoch``)."""
    import time

    score = 0.0
    for epoch in range(1, n + 1):
        record(log, f"curve({rate!r})@{epoch}")
        time.sleep(seconds)
        score = rate * (1 - 0.5 ** epoch)
        yield {"score": score, "epoch": epoch}
    return {"score": score, "epoch": n}


def timed(v, a, seconds=0.3):
    """Sleeps ``seconds`` and says where and when it ran (the table shows ``pid``, ``start``, ``end``)."""
    import os
    import time

    start = time.time()
    time.sleep(seconds)
    return {"score": a, "pid": os.getpid(), "start": start, "end": time.time()}
