"""The slow source of tests/test_warmup.py, in a module that does not import tests/warm_steps.py."""

from __future__ import annotations

import time


def slow_source(seconds: float) -> float:
    time.sleep(seconds)
    return time.time()  # when the source finished: no step after it can start before this
