"""Benchmark: one adaptive search (Optuna's TPE) written two ways, issue 47.

    python benchmarks/adaptive_search.py                 # full: 50k rows, 100 trials, 3 fresh processes each
    python benchmarks/adaptive_search.py --small         # 20k rows, 40 trials (a loaded 2-core machine)
    python benchmarks/adaptive_search.py --quick         # smoke test: tiny, 1 repetition

Workloads (a seeded ``make_classification`` table, split 80/20; accuracy on the 20%):

(a) ``prefix``: a costly categorical prefix, three feature extractors (``Nystroem(600)``,
    ``PCA(50, full SVD)``, ``SelectKBest(mutual_info_classif, k=50)``) x two model families with
    continuous parameters (``LogisticRegression(C)``; ``SGDClassifier(alpha, l1_ratio)``).
(c) ``flat``: no shared prefix, one model (``LogisticRegression(C, tol)``) on the raw table.

Methods, on the same 2 cores (one BLAS thread per process):

* ``quiver``: ``node.search(..., n_trials, sampler=TPESampler(seed=0))`` on an embedded
  LocalCluster of 2 worker processes x 1 thread (2 proposals in flight);
* ``optuna``: the same objective in Optuna's define-by-run style, ``study.optimize(n_trials,
  n_jobs=2)``, the same sampler class and seed, the data made once per process (not per trial).

Each (method, workload) runs in a fresh process, ``--repeats`` times (median reported), methods
interleaved. ``wall``: the search itself (Quiver: from the first ask to the last tell; its
cluster's start is reported apart as ``cluster_seconds``); ``process``: the child process's
whole life; ``cpu``: CPU-seconds of the child and every process it started (the work done, which
the load of a shared machine does not change as it changes the wall). Optuna's wall leaves out
making the data (``load_seconds``, recorded); Quiver's includes its source step. "Prefix fits": the feature extractor fits each method ran (Optuna: one per trial;
Quiver: one per distinct extractor proposed); "saved" is the difference. Optuna on Dask
(``DaskStorage``) is not measured: ``optuna-integration`` is not installed here.
Results: ``benchmarks/results/adaptive_search.json`` (with the load average: the machine may be shared).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread per process: every method uses exactly 2 cores

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sklearn.datasets import make_classification
from sklearn.decomposition import PCA
from sklearn.feature_selection import SelectKBest, mutual_info_classif
from sklearn.kernel_approximation import Nystroem
from sklearn.linear_model import LogisticRegression, SGDClassifier

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = {"full": (50_000, 100), "small": (20_000, 40), "quick": (3_000, 8)}
FEATURES = 200


# ---- the steps (shared by both methods) ---------------------------------------------------------------
def load(n_rows, seed=0):
    X, y = make_classification(n_rows, FEATURES, n_informative=40, random_state=seed)
    cut = int(0.8 * n_rows)
    return {"Xtr": X[:cut], "ytr": y[:cut], "Xte": X[cut:], "yte": y[cut:]}


def _features(d, extractor):
    fitted = extractor.fit(d["Xtr"], d["ytr"])
    return {"Xtr": fitted.transform(d["Xtr"]), "ytr": d["ytr"], "Xte": fitted.transform(d["Xte"]), "yte": d["yte"]}


def nystroem(d):
    return _features(d, Nystroem(n_components=600, gamma=1.0 / FEATURES, random_state=0))


def pca(d):
    return _features(d, PCA(n_components=50, svd_solver="full"))


def kbest(d):
    import functools

    sel = SelectKBest(functools.partial(mutual_info_classif, random_state=0), k=50)
    sel.fit(d["Xtr"][:5000], d["ytr"][:5000])  # mutual information on a sample: ~1-2 s
    return {"Xtr": sel.transform(d["Xtr"]), "ytr": d["ytr"], "Xte": sel.transform(d["Xte"]), "yte": d["yte"]}


def logreg(d, C, tol=1e-4):
    m = LogisticRegression(C=C, tol=tol, max_iter=100).fit(d["Xtr"], d["ytr"])
    return {"accuracy": float(m.score(d["Xte"], d["yte"]))}


def sgd(d, alpha, l1_ratio):
    m = SGDClassifier(alpha=alpha, l1_ratio=l1_ratio, penalty="elasticnet", max_iter=10, tol=None,
                      random_state=0).fit(d["Xtr"], d["ytr"])
    return {"accuracy": float(m.score(d["Xte"], d["yte"]))}


EXTRACTORS = {"nystroem": nystroem, "pca": pca, "kbest": kbest}


# ---- one measurement (in a fresh process) ---------------------------------------------------------------
def run_quiver(workload: str, n_rows: int, n_trials: int) -> dict:
    import optuna
    from optuna.distributions import FloatDistribution as Float

    from pipelines import Pipeline, space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = Pipeline(f"adaptive-{workload}").source(load, n_rows=n_rows)
    if workload == "prefix":
        node = data.explore("features", **EXTRACTORS).explore(
            "model",
            space(logreg, C=Float(1e-4, 1e2, log=True)),
            space(sgd, alpha=Float(1e-6, 1e-1, log=True), l1_ratio=Float(0.0, 1.0)))
    else:
        node = data.explore("model", space(logreg, C=Float(1e-4, 1e2, log=True), tol=Float(1e-5, 1e-2, log=True)))
    search = node.search("accuracy", n_trials=n_trials, sampler=optuna.samplers.TPESampler(seed=0))
    result = search.run(workers=2, threads_per_worker=1, quiet=True, progress=False)
    st, t = result.stats, result.table
    prefix_fits = int(t["features"].nunique()) if workload == "prefix" else 0
    return {
        "wall": st["wall_seconds"], "cluster_seconds": st["cluster_seconds"],
        "best_value": float(t["value"].max()), "trials": st["trials"], "complete": st["complete"],
        "failed": st["failed"], "prefix_fits": prefix_fits,
        "prefix_fits_saved": st["trials"] - prefix_fits if workload == "prefix" else 0,
        "prefix_tasks_saved": st["prefix_tasks_saved"],
        "executed_tasks": st["executed_tasks"], "unique_tasks": st["unique_tasks"], "naive_tasks": st["naive_tasks"],
        "shared_copies": sum(len(v) for v in (st.get("shared_copies") or {}).values()),
        "spread_tasks": st.get("spread_tasks"),
    }


def run_optuna(workload: str, n_rows: int, n_trials: int) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    clock = time.perf_counter()
    data = load(n_rows)  # once per process, as a careful Optuna user writes it
    load_seconds = time.perf_counter() - clock  # outside its wall; Quiver's wall includes its source step
    fits = [0]

    def objective(trial):
        if workload == "prefix":
            name = trial.suggest_categorical("features", list(EXTRACTORS))
            feats = EXTRACTORS[name](data)
            fits[0] += 1
            if trial.suggest_categorical("model", ["logreg", "sgd"]) == "logreg":
                return logreg(feats, C=trial.suggest_float("model.C", 1e-4, 1e2, log=True))["accuracy"]
            return sgd(feats, alpha=trial.suggest_float("model.alpha", 1e-6, 1e-1, log=True),
                       l1_ratio=trial.suggest_float("model.l1_ratio", 0.0, 1.0))["accuracy"]
        return logreg(data, C=trial.suggest_float("model.C", 1e-4, 1e2, log=True),
                      tol=trial.suggest_float("model.tol", 1e-5, 1e-2, log=True))["accuracy"]

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    clock = time.perf_counter()
    study.optimize(objective, n_trials=n_trials, n_jobs=2)
    wall = time.perf_counter() - clock
    states = [tr.state.name for tr in study.trials]
    return {"wall": wall, "load_seconds": load_seconds, "best_value": float(study.best_value), "trials": len(study.trials),
            "complete": states.count("COMPLETE"), "failed": states.count("FAIL"), "prefix_fits": fits[0],
            "prefix_fits_saved": 0}


class TreeCPU:
    """CPU-seconds of this process and every process it started (the cluster's scheduler lives
    here, its workers are children), sampled every ``interval`` s: a process that ended counts
    with its last sample. On a shared machine the wall clock is set by the CPU share each method
    gets; CPU-seconds say how much work each did."""

    def __init__(self, interval: float = 0.2):
        import threading

        import psutil

        self.me, self.interval, self.seen = psutil.Process(), interval, {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                self.seen[p.pid] = t.user + t.system
            except Exception:  # recorded: a process that ended between listing and reading
                continue

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            self._sample()

    def total(self) -> float:
        self.stop_event.set()
        self.thread.join()
        self._sample()
        return sum(self.seen.values())


def one(method: str, workload: str, size: str) -> None:
    n_rows, n_trials = SIZES[size]
    fn = run_quiver if method == "quiver" else run_optuna
    cpu = TreeCPU()
    out = fn(workload, n_rows, n_trials)
    out["cpu_seconds"] = cpu.total()  # the child's whole life: imports, the cluster's start and close included
    print("RESULT " + json.dumps(out), flush=True)


# ---- the comparison ----------------------------------------------------------------------------------
def measure(method: str, workload: str, size: str) -> dict:
    clock = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--one", method, workload, size], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
    process = time.perf_counter() - clock
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{method} {workload} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(line[7:]), "process": process}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("METHOD", "WORKLOAD", "SIZE"), help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true", help="20k rows, 40 trials")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny, 1 repetition")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--workloads", default="prefix,flat", help="comma-separated: prefix (a), flat (c: no shared prefix)")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "adaptive_search.json"))
    args = ap.parse_args()
    if args.one:
        one(*args.one)
        return
    size = "quick" if args.quick else "small" if args.small else "full"
    repeats = args.repeats or (1 if args.quick else 3)
    workloads = args.workloads.split(",")
    load_before = os.getloadavg()
    runs: dict = {w: {"quiver": [], "optuna": []} for w in workloads}
    for r in range(repeats):
        for w in workloads:
            for method in ("quiver", "optuna") if r % 2 == 0 else ("optuna", "quiver"):  # interleaved
                res = measure(method, w, size)
                runs[w][method].append(res)
                print(f"[{r + 1}/{repeats}] {w:6s} {method:6s} wall {res['wall']:7.2f} s  best {res['best_value']:.4f}  "
                      f"prefix fits {res['prefix_fits']}", flush=True)
    summary: dict = {}
    targets = {"prefix": 1.5, "flat": 1.0}
    print(f"\nsize {size}: {SIZES[size][0]} rows x {FEATURES} features, {SIZES[size][1]} TPE trials, medians of {repeats}")
    print(f"{'workload':8s} {'method':7s} {'wall s':>8s} {'process s':>9s} {'cpu s':>6s} {'best':>7s} {'spread':>13s} "
          f"{'prefix fits':>11s}")
    for w in workloads:
        s: dict = {}
        for method in ("quiver", "optuna"):
            rs = runs[w][method]
            best = [x["best_value"] for x in rs]
            s[method] = {"wall_median": statistics.median(x["wall"] for x in rs),
                         "process_median": statistics.median(x["process"] for x in rs),
                         "cpu_median": statistics.median(x["cpu_seconds"] for x in rs),
                         "best_median": statistics.median(best), "best_min": min(best), "best_max": max(best),
                         "prefix_fits_median": statistics.median(x["prefix_fits"] for x in rs), "runs": rs}
            print(f"{w:8s} {method:7s} {s[method]['wall_median']:8.2f} {s[method]['process_median']:9.2f} "
                  f"{s[method]['cpu_median']:6.1f} {s[method]['best_median']:7.4f} {best and min(best):6.4f}-{max(best):6.4f} "
                  f"{s[method]['prefix_fits_median']:11.0f}")
        q = runs[w]["quiver"]
        speedup = s["optuna"]["wall_median"] / s["quiver"]["wall_median"]
        goal = targets.get(w, 1.0)
        met = speedup >= goal
        s["speedup_wall"] = speedup
        s["speedup_process"] = s["optuna"]["process_median"] / s["quiver"]["process_median"]
        # per repeat, the pair run next to each other (the load changes between repeats)
        s["speedup_wall_paired"] = [o["wall"] / x["wall"] for x, o in zip(q, runs[w]["optuna"])]
        s["speedup_wall_paired_median"] = statistics.median(s["speedup_wall_paired"])
        s["target"] = {"speedup_at_least": goal, "met": met}
        s["executed_equals_unique"] = all(x["executed_tasks"] == x["unique_tasks"] for x in q)
        s["prefix_fits_saved_median"] = statistics.median(x["prefix_fits_saved"] for x in q)
        lo, hi = s["optuna"]["best_min"], s["optuna"]["best_max"]
        s["best_within_optuna_spread"] = lo - 1e-12 <= s["quiver"]["best_median"] <= hi + 1e-12
        summary[w] = s
        print(f"  {w}: per repeat (paired) {', '.join(f'{x:.2f}x' for x in s['speedup_wall_paired'])}")
        print(f"  {w}: Quiver speed-up (search wall) {speedup:.2f}x, target >= {goal}x [{'MET' if met else 'NOT MET'}]; "
              f"with process start {s['speedup_process']:.2f}x; executed = unique: {s['executed_equals_unique']}; "
              f"prefix fits saved (median): {s['prefix_fits_saved_median']:.0f}; Quiver's best within Optuna's "
              f"spread: {s['best_within_optuna_spread']}")
    out = {"size": size, "rows": SIZES[size][0], "features": FEATURES, "n_trials": SIZES[size][1], "repeats": repeats,
           "sampler": "TPESampler(seed=0)", "cores": os.cpu_count(), "load_average_before": load_before,
           "load_average_after": os.getloadavg(), "python": platform.python_version(), "workloads": summary}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
