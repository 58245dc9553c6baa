"""Steps for tests/test_shared_copies.py: a source and a training loop that leave a file behind
each time they run (in the directory they are given), so the test sees where and when."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np


def _note(log_dir: str, what: str, **fields) -> None:
    from distributed import get_worker

    fields.update(what=what, worker=get_worker().address, pid=os.getpid(), at=time.time())
    with open(os.path.join(log_dir, f"{what}-{uuid.uuid4().hex}.txt"), "w") as f:
        f.write(repr(fields))


def load_data(log_dir: str, seconds: float = 0.3) -> np.ndarray:
    """The shared source: 4 MB of data, made once per run (one file per execution)."""
    _note(log_dir, "source")
    time.sleep(seconds)
    return np.arange(500_000, dtype=np.float64)


def train(data: np.ndarray, log_dir: str, lr: float, epochs: int = 3, seconds: float = 0.1):
    """A training loop: one report per epoch; notes when it started on which worker."""
    _note(log_dir, "train", lr=lr)
    acc = 0.0
    for epoch in range(epochs):
        time.sleep(seconds)
        acc = 1.0 - 1.0 / (1 + lr * (epoch + 1))
        yield {"accuracy": acc}
    return {"accuracy": acc}


def broken_train(data: np.ndarray, log_dir: str, lr: float):
    """A training loop that fails at its first epoch (every branch of its run fails)."""
    _note(log_dir, "train", lr=lr)
    raise RuntimeError("broken_train: fails on purpose")
    yield {"accuracy": 0.0}  # pragma: no cover - makes it a generator step


def notes(log_dir: str, what: str) -> list[dict]:
    """The notes of ``what`` (``"source"`` or ``"train"``) left in ``log_dir``."""
    import ast

    return [ast.literal_eval(open(os.path.join(log_dir, n)).read()) for n in sorted(os.listdir(log_dir))
            if n.startswith(what + "-")]
