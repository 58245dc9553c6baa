"""Steps for tests/test_bridge.py: which process ran them, and how often."""

from __future__ import annotations

import os
import time


def source(seed: int) -> dict:
    return {"seed": seed, "pid": os.getpid()}


def slow(data: dict, a: int, seconds: float = 0.25) -> dict:
    """Sleeps (releasing the GIL, as a fit's native code does), then says where it ran."""
    time.sleep(seconds)
    return {"m": float(data["seed"] + a), "pid": os.getpid(), "source_pid": data["pid"]}


def test_step(chosen: dict) -> dict:
    return {"test": chosen["m"] * 2, "pid": os.getpid()}
