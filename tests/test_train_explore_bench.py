"""``benchmarks/train_explore.py --quick`` runs every method of its smoke set on the same
configurations and prints verdicts that follow from its own numbers.

What is asserted is behaviour, never speed: the pruned Quiver run trains fewer epochs than the
exhaustive one and keeps its best; the same training function gives the same accuracy per
configuration under Quiver and Optuna; the packed ``gpu.train`` S-SGD row (exactly momentum SGD,
same initial weights and batch order, several branches per worker) agrees with the plain loop; each "met" / "not met" agrees with the
measured values it summarises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def finished(run: dict) -> dict:
    return {(t["lr"], t["batch"]): t["accuracy"] for t in run["trials"] if t["status"] == "ok"}


def test_train_explore_quick(tmp_path):
    out = tmp_path / "train_explore.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_explore.py"), "--quick", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    methods = data["methods"]
    n = len(data["configs"])
    epochs = data["size"]["epochs"]
    assert set(methods) == {"quiver_exhaustive", "quiver_halving", "quiver_gpu_packed", "quiver_gpu_ssgd_packed",
                            "quiver_loop_packed", "optuna_sha"}
    for name, m in methods.items():
        assert m["error"] is None, (name, m["error"])
        assert len(m["runs"]) == data["repeats"] == 1
        assert all(len(r["trials"]) == n for r in m["runs"]), name
    exhaustive, pruned = methods["quiver_exhaustive"]["runs"][0], methods["quiver_halving"]["runs"][0]
    assert exhaustive["epochs_trained"] == n * epochs and exhaustive["pruned"] == 0
    assert pruned["epochs_trained"] < exhaustive["epochs_trained"] and pruned["pruned"] >= 1
    assert all(t["iterations"] < epochs for t in pruned["trials"] if t["status"] == "pruned")
    # one training function: Quiver's and Optuna's finished trials agree configuration by configuration
    reference = finished(exhaustive)
    for name in ("quiver_halving", "optuna_sha"):
        for config, acc in finished(methods[name]["runs"][0]).items():
            assert acc == pytest.approx(reference[tuple(config)], abs=1e-6), (name, config)
    # gpu.train's S-SGD over one replica is the same momentum SGD, packed or not; float order may flip
    # a few predictions
    for name in ("quiver_gpu_ssgd_packed", "quiver_loop_packed"):  # the declared loop too (gpu.Loop)
        for config, acc in finished(methods[name]["runs"][0]).items():
            assert acc == pytest.approx(reference[tuple(config)], abs=0.01), (name, config)
    best = max(reference.values())
    assert pruned["best_accuracy"] == pytest.approx(best, abs=1e-6)
    assert data["targets"]["c_vs_d"] is not None and data["targets"]["b_vs_d"] is not None
    for key, t in data["targets"].items():
        if t is None:  # a warm or fresh-workers row: not in the smoke set
            assert "warm" in key or "fresh" in key
            continue
        assert t["speedup_met"] == (t["speedup"] >= t["target_speedup"])
        assert t["accuracy_met"] == (t["accuracy_gap"] <= t["target_accuracy_gap"])
        assert t["met"] == (t["speedup_met"] and t["accuracy_met"])
    verdict = "MET" if data["targets"]["c_vs_d"]["met"] else "NOT MET"
    assert "target (c) packed S-SGD vs (d): " in proc.stdout and f"[{verdict}]" in proc.stdout
