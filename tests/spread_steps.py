"""Steps for tests/test_spread.py: siblings that say which worker ran them, and when."""

from __future__ import annotations

import time


def source(seed: int) -> dict:
    return {"seed": seed}


def sibling(data: dict, a: int, seconds: float = 0.3) -> dict:
    from distributed import get_worker

    start = time.time()
    time.sleep(seconds)
    return {"m": float(data["seed"] + a), "worker": get_worker().address, "start": start, "end": time.time()}


def after(chosen: dict, b: int, seconds: float = 0.3) -> dict:
    """A step of the stage after a choose: it reads the chosen branch's value."""
    from distributed import get_worker

    start = time.time()
    time.sleep(seconds)
    return {"n": chosen["m"] + b, "worker": get_worker().address, "start": start, "end": time.time()}
