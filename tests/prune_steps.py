"""Iterative (generator) steps with scripted curves, for the pruning-run tests
(tests/test_prune_run.py).  Each step records, in files under ``log_dir``, when it started
(one file per start, named by a global counter so the start order can be read back without
clocks), and in its ``finally`` that its generator was closed and after how many reports."""

from __future__ import annotations

import os
import time
import uuid


def _mark(log_dir: str, kind: str, name: str, text: str = "") -> None:
    # a name that sorts in creation order across processes: ns clock + a random tail
    path = os.path.join(log_dir, f"{kind}-{time.time_ns():020d}-{uuid.uuid4().hex[:6]}-{name}")
    with open(path, "w") as f:
        f.write(text)


def events(log_dir: str, kind: str) -> list[tuple[str, str]]:
    """``[(name, text)]`` of the ``kind`` marks, in the order they were written."""
    out = []
    for f in sorted(os.listdir(log_dir)):
        if f.startswith(kind + "-"):
            with open(os.path.join(log_dir, f)) as fh:
                out.append((f.split("-", 3)[3], fh.read()))
    return out


def data() -> dict:
    return {"n": 1}


def curve(data: dict, spec: tuple, log_dir: str, delay: float = 0.0, pid: bool = False):
    """``spec = (name, values)``: yield ``{"score": v, "step": i}`` for each scripted ``v``;
    return ``{"score": last, "name": name}``.  A name ``"failN"`` raises at iteration N.
    ``pid``: write this worker's pid in the start mark, and an ``iter`` mark per report."""
    name, values = spec
    fail_at = int(name[4:]) if name.startswith("fail") else 0
    _mark(log_dir, "start", name, str(os.getpid()) if pid else "")
    done = 0
    try:
        for v in values:
            if delay:
                time.sleep(delay)
            done += 1
            if done == fail_at:
                raise RuntimeError(f"{name} fails at iteration {done}")
            if pid:
                _mark(log_dir, "iter", name, str(done))
            yield {"score": v, "step": done}
        return {"score": values[-1], "name": name}
    finally:
        _mark(log_dir, "closed", name, str(done))


def plain(data: dict, spec: tuple, log_dir: str = "") -> dict:
    """Not iterative: the same final figures at once."""
    name, values = spec
    return {"score": values[-1], "name": name}


def tag(data: dict, g: str) -> dict:
    """A first explore to group by (``choose(..., per="g")``)."""
    return dict(data, g=g)


def slow_data(seconds: float) -> dict:
    """A shared source that takes ``seconds`` (every branch's path starts with it)."""
    time.sleep(seconds)
    return {"n": 1}
