""""Am I in a Dask task?": one answer (gpu.worker), used by every module that asks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _answers():
    from gpu import gang, training
    from gpu.worker import current_task, current_worker
    from graph.iterative import _Task

    w = current_worker()
    t = _Task()
    return {
        "worker": None if w is None else w.address,
        "task": current_task(),
        "training._current_task": training._current_task(),
        "training._worker_address": training._worker_address(),
        "gang._inside_task": gang._inside_task(),
        "iterative._Task": (None if t.worker is None else t.worker.address, t.key),
    }


def test_every_module_gives_the_same_answer_inside_and_outside_a_task(client):
    outside = _answers()
    assert outside == {"worker": None, "task": None, "training._current_task": None, "training._worker_address": None,
                       "gang._inside_task": False, "iterative._Task": (None, None)}
    fut = client.submit(_answers, key="quiver-in-task-probe", pure=False)
    inside = fut.result()
    assert inside["worker"] in client.scheduler_info()["workers"]
    assert inside["task"] == inside["training._current_task"] == "quiver-in-task-probe"
    assert inside["training._worker_address"] == inside["worker"] and inside["gang._inside_task"] is True
    assert inside["iterative._Task"] == (inside["worker"], "quiver-in-task-probe")


def test_only_gpu_worker_calls_get_worker():
    """The rule has one owner: no other module asks ``distributed.get_worker()`` (and turns its
    errors into an answer of its own)."""
    calls = []
    for package in ("pipelines", "graph", "gpu"):
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() == "gpu/worker.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bget_worker\(\)", line) and "``" not in line:
                    calls.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert calls == []
