"""Steps for tests/test_warmup.py; each worker process records when it imported this module."""

from __future__ import annotations

import time

IMPORTED_AT = time.time()


def widen(data: float, a: int) -> dict:
    return {"m": data + a, "imported_at": IMPORTED_AT}
