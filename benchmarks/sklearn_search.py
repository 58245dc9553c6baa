"""Benchmark: one scikit-learn grid search with a costly shared prefix, four ways.

    python benchmarks/sklearn_search.py             # full run (a few minutes on 2 cores)
    python benchmarks/sklearn_search.py --quick     # smoke test: 1 repetition, small problem
    python benchmarks/sklearn_search.py --checks    # also run all of scikit-learn's estimator checks
    python benchmarks/sklearn_search.py --halving   # the successive-halving rows instead (see below)

The search: ``Pipeline([scale: StandardScaler, pca: CostlyPCA (full SVD, the costly shared
step), clf: LogisticRegression])`` over ``pca__n_components`` (4 values) x ``clf__C`` (10
values) = 40 candidates, 5-fold stratified CV, ``refit=False``, on a seeded
``make_classification`` table (3000 x 400).  Methods, all on the same 2 cores:

(a) ``pipelines.sklearn.GridSearchCV`` on a LocalCluster (2 worker processes x 1 thread).
(b) scikit-learn's ``GridSearchCV(n_jobs=2)``, no memory.
(c) the same with ``Pipeline(memory=joblib cache)`` (a fresh cache directory per repetition).
(d) dask-ml's ``GridSearchCV`` on the same cluster as (a) (it merges shared prefixes too).

Each CostlyPCA fit leaves a file in a directory (a side effect), so "prefix fits" counts the
PCA fits each method really executed; the unique (prefix, params, fold) count is 4 x 5 = 20.
Every method must give the same ``split<i>_test_score`` for every candidate (checked,
exactly); a ``mean_test_score`` that differs is flagged (dask-ml weights the mean by the
test folds' sizes, scikit-learn and Quiver do not).  Wall time: median of the repetitions, methods interleaved.
Results go to ``benchmarks/results/sklearn_search.json``; the load average is recorded
because the machine may be shared.

``--halving``: successive halving on the same pipeline and data, ``pca__n_components`` (4
values: 5, 10, 20, 30) x ``clf__C`` (25 values) = 100 candidates, ``factor=2``,
``resource="n_samples"``, 5 folds, ``random_state=0``, ``refit=False``: (h)
``pipelines.sklearn.HalvingGridSearchCV`` on the LocalCluster, (i) scikit-learn's
``HalvingGridSearchCV(n_jobs=2)``, (j) the same with ``Pipeline(memory=...)``.  Each
iteration subsamples the folds, so a PCA fit is shared only inside an iteration: Quiver fits
one per (n_components, fold, iteration).  Checked: same ``best_params_``, ``n_candidates_``,
``n_resources_`` and split scores as (i).  Results: ``benchmarks/results/sklearn_halving.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread per process: every method uses exactly 2 cores

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sklearn_search_steps import CostlyPCA  # noqa: E402  (a module, so joblib's cache and the workers can import it)

RESULTS = ROOT / "benchmarks" / "results"

FULL = dict(n_samples=3000, n_features=400, components=[10, 20, 30, 40], C=list(np.logspace(-3, 2, 10)), folds=5)
QUICK = dict(n_samples=400, n_features=40, components=[4, 8], C=[0.1, 1.0, 10.0], folds=3)


def pipeline(log_dir, memory=None):
    return Pipeline([("scale", StandardScaler()), ("pca", CostlyPCA(log_dir=log_dir)),
                     ("clf", LogisticRegression(max_iter=300))], memory=memory)


def grid(cfg):
    return {"pca__n_components": cfg["components"], "clf__C": [float(c) for c in cfg["C"]]}


def scores(cv_results, folds):
    """{candidate params: (mean, split scores)} for comparing methods."""
    out = {}
    for i, p in enumerate(cv_results["params"]):
        key = tuple(sorted((k, float(v)) for k, v in p.items()))
        out[key] = [float(cv_results["mean_test_score"][i])] + [float(cv_results[f"split{f}_test_score"][i]) for f in range(folds)]
    return out


def timed(method, cfg, X, y, client):
    log = tempfile.mkdtemp(prefix="quiver-bench-fits-")
    cache = tempfile.mkdtemp(prefix="quiver-bench-cache-") if method == "c" else None
    extra = {}
    try:
        est = pipeline(log, memory=cache)
        t0 = time.perf_counter()
        if method == "a":
            from pipelines.sklearn import GridSearchCV

            search = GridSearchCV(est, grid(cfg), cv=cfg["folds"], refit=False, client=client, progress=False).fit(X, y)
            s = search.quiver_result_.stats
            extra = {k: s[k] for k in ("executed_tasks", "unique_tasks", "naive_tasks")}
        elif method in ("b", "c"):
            from sklearn.model_selection import GridSearchCV

            search = GridSearchCV(est, grid(cfg), cv=cfg["folds"], refit=False, n_jobs=2).fit(X, y)
        else:
            from dask_ml.model_selection import GridSearchCV

            search = GridSearchCV(est, grid(cfg), cv=cfg["folds"], refit=False, scheduler=client).fit(X, y)
        wall = time.perf_counter() - t0
        return wall, len(os.listdir(log)), scores(search.cv_results_, cfg["folds"]), extra
    finally:
        shutil.rmtree(log, ignore_errors=True)
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


HALVING_FULL = dict(n_samples=3000, n_features=400, components=[5, 10, 20, 30], C=list(np.logspace(-3, 2, 25)),
                    folds=5)
HALVING_QUICK = dict(n_samples=400, n_features=40, components=[2, 4], C=[0.01, 0.1, 1.0, 10.0], folds=3)
HALVING_NAMES = {
    "h": "(h) Quiver HalvingGridSearchCV",
    "i": "(i) sklearn HalvingGridSearchCV(n_jobs=2)",
    "j": "(j) sklearn halving, Pipeline(memory)",
}


def halving_timed(method, cfg, X, y, client):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401

    log = tempfile.mkdtemp(prefix="quiver-bench-fits-")
    cache = tempfile.mkdtemp(prefix="quiver-bench-cache-") if method == "j" else None
    kwargs = dict(factor=2, cv=cfg["folds"], refit=False, random_state=0)
    try:
        est = pipeline(log, memory=cache)
        t0 = time.perf_counter()
        if method == "h":
            from pipelines.sklearn import HalvingGridSearchCV

            search = HalvingGridSearchCV(est, grid(cfg), client=client, progress=False, **kwargs).fit(X, y)
            extra = {"executed_tasks": sum(r.stats["executed_tasks"] for r in search.quiver_results_),
                     "unique_tasks": sum(r.stats["unique_tasks"] for r in search.quiver_results_)}
        else:
            from sklearn.model_selection import HalvingGridSearchCV

            search = HalvingGridSearchCV(est, grid(cfg), n_jobs=2, **kwargs).fit(X, y)
            extra = {}
        wall = time.perf_counter() - t0
        res = search.cv_results_
        summary = {"best_params": {k: float(v) for k, v in sorted(search.best_params_.items())},
                   "n_candidates": list(search.n_candidates_), "n_resources": list(search.n_resources_),
                   "splits": [[float(res[f"split{f}_test_score"][i]) for f in range(cfg["folds"])]
                              for i in range(len(res["params"]))]}
        return wall, len(os.listdir(log)), summary, extra
    finally:
        shutil.rmtree(log, ignore_errors=True)
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


def halving_main(args):
    cfg = HALVING_QUICK if args.quick else HALVING_FULL
    repeats = args.repeats or 1
    output = args.output or RESULTS / ("sklearn_halving.quick.json" if args.quick else "sklearn_halving.json")
    methods = [m for m in (args.methods if set(args.methods) <= set("hij") else "hij")]
    X, y = make_classification(cfg["n_samples"], cfg["n_features"], n_informative=20, n_classes=3, random_state=0)
    n_candidates = len(cfg["components"]) * len(cfg["C"])
    print(f"halving: {n_candidates} candidates x {cfg['folds']} folds, factor 2, X {X.shape}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    from distributed import Client, LocalCluster

    import pipelines.sklearn  # noqa: F401  imported before timing

    runs = {m: [] for m in methods}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        for rep in range(repeats):
            for m in methods:
                wall, fits, summary, extra = halving_timed(m, cfg, X, y, client)
                runs[m].append({"wall_s": wall, "prefix_fits": fits, "summary": summary, **extra})
                print(f"  rep {rep}: {HALVING_NAMES[m]:42s} {wall:7.2f} s  prefix fits {fits}")
    ref = runs[methods[0]][0]["summary"]
    rows = {}
    print(f"\n{'method':42s} {'median s':>8s} {'prefix fits':>11s}   same best_params_, n_candidates_, n_resources_, split scores")
    for m in methods:
        walls = [r["wall_s"] for r in runs[m]]
        same = all(r["summary"] == ref for r in runs[m])
        rows[m] = {"median_s": statistics.median(walls), "walls_s": walls,
                   "prefix_fits": [r["prefix_fits"] for r in runs[m]], "same_as_first": same,
                   **{k: v for k, v in runs[m][0].items() if k in ("executed_tasks", "unique_tasks")}}
        print(f"{HALVING_NAMES[m]:42s} {rows[m]['median_s']:8.2f} {max(rows[m]['prefix_fits']):11d}   "
              f"{'yes' if same else 'NO'}")
    record = {"benchmark": "sklearn_halving", "mode": "quick" if args.quick else "full", "config": cfg,
              "n_candidates": n_candidates, "repeats": repeats, "nproc": os.cpu_count(),
              "load_average_end": os.getloadavg(), "versions": versions(),
              "n_candidates_per_iteration": ref["n_candidates"], "n_resources_per_iteration": ref["n_resources"],
              "best_params": ref["best_params"],
              "methods": {HALVING_NAMES[m]: rows[m] for m in methods},
              "command": "python " + " ".join(["benchmarks/sklearn_search.py", *sys.argv[1:]])}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"wrote {output}")


def estimator_checks(client):
    """All of scikit-learn's estimator checks on a classifier and a regressor search."""
    from sklearn.linear_model import Ridge
    from sklearn.utils.estimator_checks import check_estimator

    from pipelines.sklearn import GridSearchCV

    out = {}
    for est, grid_ in ((LogisticRegression(), {"C": [0.5, 1.0]}), (Ridge(), {"alpha": [0.5, 1.0]})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = check_estimator(GridSearchCV(est, grid_, cv=2, client=client.scheduler.address), on_fail=None)
        failed = {r["check_name"]: str(r["exception"])[:300] for r in res if r["status"] == "failed"}
        out[type(est).__name__] = {"checks": len(res), "failed": failed}
        print(f"estimator checks, GridSearchCV({type(est).__name__}): {len(res)} run, {len(failed)} failed "
              + ", ".join(failed))
    return out


def versions():
    import dask
    import distributed
    import joblib
    import sklearn

    out = {"python": platform.python_version(), "numpy": np.__version__, "dask": dask.__version__,
           "distributed": distributed.__version__, "scikit-learn": sklearn.__version__, "joblib": joblib.__version__}
    try:
        import dask_ml

        out["dask-ml"] = dask_ml.__version__
    except Exception as exc:
        out["dask-ml"] = f"import failed: {type(exc).__name__}: {exc}"
    return out


NAMES = {
    "a": "(a) Quiver GridSearchCV",
    "b": "(b) sklearn GridSearchCV(n_jobs=2)",
    "c": "(c) sklearn, Pipeline(memory)",
    "d": "(d) dask-ml GridSearchCV",
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 repetition, small problem")
    ap.add_argument("--repeats", type=int, default=None, help="repetitions per method (default 3; 1 with --quick)")
    ap.add_argument("--methods", default="abcd", help="which methods to run (default abcd)")
    ap.add_argument("--repeats-b", type=int, default=None,
                    help="repetitions of (b), the slowest (default: --repeats); its first runs interleave with the others")
    ap.add_argument("--checks", action="store_true", help="also run scikit-learn's estimator checks")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--halving", action="store_true",
                    help="run the successive-halving rows instead: (h) Quiver, (i) sklearn n_jobs=2, (j) with memory")
    args = ap.parse_args(argv)
    if args.halving:
        return halving_main(args)
    cfg = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    output = args.output or RESULTS / ("sklearn_search.quick.json" if args.quick else "sklearn_search.json")
    X, y = make_classification(cfg["n_samples"], cfg["n_features"], n_informative=20, n_classes=3, random_state=0)
    n_candidates = len(cfg["components"]) * len(cfg["C"])
    unique_prefix = len(cfg["components"]) * cfg["folds"]
    print(f"{n_candidates} candidates x {cfg['folds']} folds, X {X.shape}; unique (PCA params, fold) = {unique_prefix}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    from distributed import Client, LocalCluster

    import pipelines.sklearn  # noqa: F401  imported before timing, like the others
    try:
        import dask_ml.model_selection  # noqa: F401  (its import takes seconds: not part of a search)
    except Exception:
        pass

    runs = {m: [] for m in args.methods}
    errors = {}
    ref_scores = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        for rep in range(repeats):
            for m in args.methods:
                if m in errors or (m == "b" and args.repeats_b is not None and rep >= args.repeats_b):
                    continue
                try:
                    wall, fits, sc, extra = timed(m, cfg, X, y, client)
                except Exception as exc:  # e.g. dask-ml not importable: a documented gap, not a crash
                    errors[m] = f"{type(exc).__name__}: {exc}"
                    print(f"{NAMES[m]}: FAILED {errors[m]}")
                    continue
                runs[m].append({"wall_s": wall, "prefix_fits": fits, "scores": sc, **extra})
                if ref_scores and sc != ref_scores[0]:
                    ref = ref_scores[0]
                    mean = max(abs(sc[k][0] - ref[k][0]) for k in ref)
                    split = max(abs(a - b) for k in ref for a, b in zip(sc[k][1:], ref[k][1:]))
                    print(f"  {NAMES[m]}: differs from {NAMES[args.methods[0]]}: mean_test_score by up to "
                          f"{mean:.3g}, split scores by up to {split:.3g}")
                ref_scores = ref_scores or [sc]
                print(f"  rep {rep}: {NAMES[m]:38s} {wall:7.2f} s  prefix fits {fits}")
        checks = estimator_checks(client) if args.checks else None
    ref = next((runs[m][0]["scores"] for m in args.methods if runs[m]), None)
    rows, table = {}, []
    for m in args.methods:
        if not runs[m]:
            continue
        walls = [r["wall_s"] for r in runs[m]]
        same = all({k: v[1:] for k, v in r["scores"].items()} == {k: v[1:] for k, v in ref.items()} for r in runs[m])
        same_mean = all({k: v[0] for k, v in r["scores"].items()} == {k: v[0] for k, v in ref.items()} for r in runs[m])
        rows[m] = {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                   "prefix_fits": [r["prefix_fits"] for r in runs[m]], "same_split_scores": same,
                   "same_mean_test_score": same_mean}
        extra = runs[m][0]
        tasks = f"{extra['executed_tasks']}/{extra['unique_tasks']}" if "executed_tasks" in extra else "n/a"
        table.append(f"{NAMES[m]:38s} {rows[m]['median_s']:8.2f} {rows[m]['min_s']:7.2f} {rows[m]['max_s']:7.2f} "
                     f"{max(rows[m]['prefix_fits']):11d} {tasks:>14s}   {'yes' if same else 'NO'}{'' if same_mean else ' (mean_test_score differs)'}")
    print(f"\n{'method':38s} {'median s':>8s} {'min s':>7s} {'max s':>7s} {'prefix fits':>11s} {'exec/unique':>14s}   same split scores")
    print("\n".join(table))
    target = None
    if "a" in rows:
        others = [rows[m]["median_s"] for m in "cd" if m in rows]
        target = {
            "faster_than_c_and_d": bool(others) and all(rows["a"]["median_s"] < o for o in others),
            "prefix_fits_equal_unique": all(f == unique_prefix for f in rows["a"]["prefix_fits"]),
        }
        print(f"target: (a) faster than (c) and (d): {'MET' if target['faster_than_c_and_d'] else 'NOT MET'}; "
              f"(a) prefix fits = unique (prefix, params, fold) = {unique_prefix}: "
              f"{'MET' if target['prefix_fits_equal_unique'] else 'NOT MET'}")
    record = {
        "benchmark": "sklearn_search", "mode": "quick" if args.quick else "full", "config": cfg,
        "n_candidates": n_candidates, "unique_prefix_fits": unique_prefix, "repeats": repeats,
        "nproc": os.cpu_count(), "load_average_end": os.getloadavg(), "versions": versions(),
        "methods": {NAMES[m]: {**rows.get(m, {}), "runs": [{k: v for k, v in r.items() if k != "scores"} for r in runs[m]]}
                    for m in args.methods},
        "errors": {NAMES[m]: e for m, e in errors.items()}, "target": target, "estimator_checks": checks,
        "command": "python " + " ".join(["benchmarks/sklearn_search.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
