"""Steps with known temporaries for the working-memory tests (NumPy only).

``temporary(x, mb)`` allocates and fills an ``mb`` MiB buffer, keeps it a moment (long enough
for Dask's memory monitor, which samples every 100 ms, to see it), frees it and returns a small
value; ``grow(x, i, mb, keep_mb)`` does the same and returns a ``keep_mb`` MiB result.

>>> temporary(seed(), mb=1, hold=0.0)["sum"]
131072.0
>>> grow(seed(), 2, mb=1, keep_mb=1, hold=0.0)["a"].nbytes
1048576
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["seed", "temporary", "grow", "score", "too_big"]

MiB = 2**20


def seed() -> dict:
    return {"x": 1.0}


def temporary(x: dict, mb: int, hold: float = 0.3) -> dict:
    buf = np.ones(mb * MiB // 8)  # touched: every page is resident
    time.sleep(hold)
    total = float(buf.sum())
    del buf
    return {"x": x["x"], "sum": total}


def grow(x: dict, i: int, mb: int, keep_mb: int, hold: float = 0.5) -> dict:
    buf = np.ones(mb * MiB // 8)
    time.sleep(hold)
    total = float(buf.sum())
    del buf
    return {"score": float(i), "sum": total, "a": np.full(keep_mb * MiB // 8, float(i))}


def score(v: dict) -> dict:
    return {"score": v["score"]}


def too_big(mb: int) -> np.ndarray:
    """A result of ``mb`` MiB built with a temporary as large (``x + 1``): twice ``mb`` at its peak."""
    x = np.ones(mb * MiB // 8)
    return x + 1.0
