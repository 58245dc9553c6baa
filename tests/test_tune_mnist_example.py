"""The MNIST tuning example prunes losing training runs and keeps what an exhaustive run keeps.

A short version of ``examples/tune_mnist.py`` (3 learning rates x batch 64 x 3 epochs, rung at
epoch 1) on the session's real LocalCluster, checked against the same training function run
to its end in this process: every branch's reports are the solo run's (a pruned branch's are its
first ``iterations`` reports), the pruned branches stopped at the rung the halving rule gives, and
the chosen branch is the exhaustive best. Then the script itself, as the README runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.example_module import example_module

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

LRS, BATCHES, EPOCHS = [0.1, 0.01, 0.003], [64], 3


@pytest.fixture(scope="module")
def example():
    with example_module("tune_mnist.py", "tune_mnist_example") as module:
        yield module


def solo_reports(example) -> dict:
    """Each configuration trained to its end in this process (one thread, as on a worker)."""
    import torch

    threads = torch.get_num_threads()
    try:
        data = example.load_mnist(seed=0)
        return {(lr, b): [{k: r[k] for k in ("accuracy", "loss")} for r in example.train_mlp(data, lr, b, epochs=EPOCHS)]
                for lr in LRS for b in BATCHES}
    finally:
        torch.set_num_threads(threads)  # train_mlp sets one thread; leave this process as it was


def test_pruned_exploration_matches_solo_runs_and_keeps_the_exhaustive_best(client, example):
    result = example.exploration(LRS, BATCHES, epochs=EPOCHS, prune=True).run(client, progress=False, quiet=True)
    solo = solo_reports(example)
    table, history = result.table, result.history
    assert len(table) == len(LRS) * len(BATCHES) and history is not None
    for row, (_, r) in enumerate(table.iterrows()):
        reports = history[row]
        assert r["iterations"] == len(reports)
        expected = solo[(r["train.lr"], r["train.batch"])]
        # same function, same seed, one thread: a branch's reports are its solo run's, report for report
        for got, want in zip(reports, expected):
            assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        if r["status"] == "pruned":
            assert r["iterations"] == 1  # the only rung below max_iter=3 is epoch 1
        else:
            assert r["status"] == "ok" and r["iterations"] == EPOCHS
            assert r["accuracy"] == pytest.approx(expected[-1]["accuracy"], abs=1e-6)
    # at epoch 1, lr=0.003 is behind lr=0.1 whatever the arrival order, and the third branch to
    # arrive continues only in the top max(1, 3 // 3) = 1: someone is pruned, so less is trained
    assert (table["status"] == "pruned").sum() >= 1
    assert table["iterations"].sum() < len(table) * EPOCHS
    assert result.stats["pruned_branches"] == (table["status"] == "pruned").sum()
    assert result.stats["time_to_first_rung_s"] is not None
    # the branch kept is the exhaustive best: pruning lost nothing here
    best = max(solo, key=lambda c: solo[c][-1]["accuracy"])
    chosen = result.chosen.iloc[0]
    assert (chosen["train.lr"], chosen["train.batch"]) == best
    assert result.value["accuracy"] == pytest.approx(solo[best][-1]["accuracy"], abs=1e-6)


def test_script_quick_mode_prints_the_table_and_the_choice():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "tune_mnist.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "iterations" in out and "pruned" in out and "chosen: lr=" in out
    rows = [line.split() for line in out.splitlines()]
    rows = [r for r in rows if len(r) >= 7 and r[0].isdigit() and r[1] in ("0.01", "0.30")]
    assert len(rows) == 4  # the 2 x 2 quick grid, one row per branch
    # a pruned branch shows the accuracy it last reported (issue 49), a number, not NaN
    pruned = [r[5] for r in rows if r[6] == "pruned"]
    assert pruned and all(0.0 <= float(a) <= 1.0 for a in pruned)
