"""Benchmark: the cases a user times first, Quiver against the tool they already have.

    python benchmarks/common_cases.py                  # every workload, 5 repeats (about 25 min on 2 cores)
    python benchmarks/common_cases.py --repeats 3 --workloads dropin36,digits
    python benchmarks/common_cases.py --quick          # smoke test: small sizes, 1 repeat

Workloads (all on the same 2 cores: Dask clusters of 2 worker processes x 1 thread,
scikit-learn with ``n_jobs=2``, one BLAS thread per process):

grid112    ``make_classification`` 8,000 x 30, 4 scalers x {PCA, SelectKBest} x k {8, 16} x
           {logistic regression C x 3, random forest depth x 2, HistGradientBoosting lr x 2}:
           112 branches, a choose on validation accuracy and a test step. Cheap prefixes,
           costly models: little for Quiver to save.
dropin36   the drop-in ``pipelines.sklearn.GridSearchCV`` on ``load_breast_cancer``: scaler x
           PCA x {SVC, logistic regression} x C, 36 candidates, ``cv=5``: a cheap prefix and
           tiny fits, where per-task and start-up costs show.
digits     digits, 2 scalers x degree-2 polynomial features + full-SVD PCA k {16, 32} x 5
           models: 20 branches whose prefix costs more than their models (Quiver's case).
torch12    a user's own PyTorch loop over 12 MNIST configurations with ``halving(3)`` (the
           functions of benchmarks/train_explore.py): Quiver's generator step vs Optuna's
           ``SuccessiveHalvingPruner`` with ``n_jobs=2``; the clock includes importing torch,
           as for a ``python tune.py``.
stepcost   one model step (logistic regression, random forest, HistGradientBoosting, SVC on the
           grid112 table) timed in a plain process, in a Quiver embedded worker and in a plain
           ``LocalCluster`` worker (Dask's worker environment): a step's own cost where it runs.

Tools per workload: Quiver (embedded cluster; ``quiver_nobridge``: with dask config
``quiver.embedded-cluster.bridge: false``, its first tasks waiting for the workers; ``quiver_nospread``:
``quiver.spread-ready: false``, every task placed by Dask alone); scikit-learn ``GridSearchCV(n_jobs=2)`` with
``PredefinedSplit`` (the validation split) without and with ``Pipeline(memory=...)``; one
``dask.compute`` of ``dask.delayed(pure=True)`` branches on a ``LocalCluster`` the script starts
(identical prefixes get one key, so Dask runs them once too); dask-ml's ``GridSearchCV`` on
that cluster. The drop-in workload compares the drop-in with scikit-learn's class (plain and
with memory) and dask-ml's.

The clock is the user's: each (workload, tool, repeat) runs in a fresh process; the clock
starts after the imports a script has at its top (``pipelines``, scikit-learn, ``distributed``)
and includes starting and closing any cluster. ``first`` is a script's first call, plus the
close at its end; ``second`` is a second call in the same process (a notebook's next cell):
Quiver's kept cluster and joblib's kept pool make it cheaper. Medians of the repeats with
min-max. For Quiver rows, where the time went: compile, cluster start, the run (its workers'
busy fraction), and the close. Results: ``benchmarks/results/common_cases.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread per process: every tool uses exactly 2 cores

import argparse
import atexit
import json
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
RESULTS = HERE / "results" / "common_cases.json"

WORKLOADS = {
    "grid112": ["quiver", "quiver_nobridge", "quiver_nospread", "sklearn", "sklearn_memory", "dask_compute", "dask_ml"],
    "dropin36": ["quiver", "quiver_nobridge", "quiver_nospread", "sklearn", "sklearn_memory", "dask_ml"],
    "digits": ["quiver", "quiver_nobridge", "quiver_nospread", "sklearn", "sklearn_memory", "dask_compute", "dask_ml"],
    "torch12": ["quiver", "optuna"],
    "stepcost": ["plain", "quiver_worker", "dask_worker"],
}

STEPCOST = [("logreg", 1.0), ("forest", 8), ("hgb", 0.2), ("svc", 1.0)]


# ----------------------------------------------------------------------------- one measurement (child)


def _cluster():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0")
    return cluster, Client(cluster)


def _exploration(S, spec: dict, seed: int, load):
    from pipelines import Pipeline, grid

    p = Pipeline("common")
    data = p.source(load, seed=seed)
    scaled = data.explore("scaler", *[grid(S.scale, kind=[k]) for k in spec["scaler"]])
    kinds: dict = {}
    for kind, value in spec["features"]:
        kinds.setdefault(kind, []).append(value)
    feats = scaled.explore("features", *[grid(S.STEPS[k], k=v) for k, v in kinds.items()])
    models: dict = {}
    for kind, value in spec["model"]:
        models.setdefault(kind, []).append(value)
    arg = {"logreg": "C", "svc": "C", "forest": "depth", "hgb": "lr"}
    fitted = feats.explore("model", *[grid(S.STEPS[k], **{arg[k]: v}) for k, v in models.items()])
    return fitted.choose("accuracy", mode="max").then(S.test_accuracy)


def _quiver_explore(S, spec, load):
    node = _exploration(S, spec, 0, load)

    def call():
        r = node.run(quiet=True, progress=False, workers=2)
        st = r.stats
        return {"score": r.value["accuracy"], "test": r.value["test_accuracy"],
                "breakdown": {k: st.get(k) for k in ("compile_seconds", "cluster", "worker_start", "bridge", "bridge_tasks", "spread_tasks", "cluster_seconds",
                                                     "wall_seconds", "busy_fraction", "executed_tasks", "naive_tasks")}}
    return call


def _cache_dir() -> str:
    """A new directory for one search's ``Pipeline(memory=...)``, removed when this process exits:
    after its timings, so the baseline's clock holds no clean-up a user would not do."""
    cache = tempfile.mkdtemp(prefix="cc-cache-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return cache


def _sk_search(S, spec, load, memory: bool, dask_ml: bool):
    import numpy as np
    from sklearn.base import clone
    from sklearn.pipeline import Pipeline as SkPipeline

    data = load(0)
    X, y, cv = S.predefined(data)
    state: dict = {}

    def call():
        cache = _cache_dir() if memory else None
        pipe = SkPipeline([("scaler", S.StandardScaler()), ("features", S.PCA()), ("model", S.LogisticRegression())],
                          memory=cache)
        if dask_ml:
            import dask_ml.model_selection as dms

            if "client" not in state:
                state["cluster"], state["client"] = _cluster()
            search = dms.GridSearchCV(pipe, S.sk_grid(spec), cv=cv, refit=False, scheduler=state["client"])
        else:
            from sklearn.model_selection import GridSearchCV

            search = GridSearchCV(pipe, S.sk_grid(spec), cv=cv, refit=False, n_jobs=2)
        search.fit(X, y)
        res = search.cv_results_  # dask-ml has no best_params_ with refit=False
        i = int(np.argmax(res["mean_test_score"]))
        # the test step: refit on train, score on test; with memory, through the same cache, as an
        # expert would (the fold's training rows are X_train: the scaler and feature fits are hits)
        best = clone(pipe).set_params(**res["params"][i])
        best.fit(data["X_train"], data["y_train"])
        return {"score": float(res["mean_test_score"][i]), "test": float(best.score(data["X_test"], data["y_test"]))}

    def close():
        if "client" in state:
            state["client"].close()
            state["cluster"].close()
    return call, close


def _dask_compute(S, spec, load):
    state: dict = {}

    def call():
        import dask

        if "client" not in state:
            state["cluster"], state["client"] = _cluster()
        data = dask.delayed(load, pure=True)(0)
        arg = {"logreg": "C", "svc": "C", "forest": "depth", "hgb": "lr"}
        fits = []
        for s, (fk, fv), (mk, mv) in S.branches(spec):
            scaled = dask.delayed(S.scale, pure=True)(data, kind=s)
            feats = dask.delayed(S.STEPS[fk], pure=True)(scaled, k=fv)
            fits.append(dask.delayed(S.STEPS[mk], pure=True)(feats, **{arg[mk]: mv}))
        fits = dask.persist(*fits)  # kept on the cluster: the test step reads the chosen fit, not a recomputed one
        accs = dask.compute(*[dask.delayed(lambda f: f["accuracy"], pure=True)(f) for f in fits])
        best = max(range(len(accs)), key=accs.__getitem__)
        test = dask.delayed(S.test_accuracy, pure=True)(fits[best]).compute()
        return {"score": accs[best], "test": test["test_accuracy"]}

    def close():
        if "client" in state:
            state["client"].close()
            state["cluster"].close()
    return call, close


def _dropin(tool: str):
    from sklearn.datasets import load_breast_cancer
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline as SkPipeline
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    from sklearn.svm import SVC

    X, y = load_breast_cancer(return_X_y=True)
    grid = [{"scale": [StandardScaler(), MinMaxScaler()], "pca__n_components": [5, 10, 20], "clf": [SVC()],
             "clf__C": [0.1, 1.0, 10.0]},
            {"scale": [StandardScaler(), MinMaxScaler()], "pca__n_components": [5, 10, 20],
             "clf": [LogisticRegression(max_iter=2000)], "clf__C": [0.1, 1.0, 10.0]}]
    state: dict = {}

    def call():
        cache = _cache_dir() if tool == "sklearn_memory" else None
        pipe = SkPipeline([("scale", StandardScaler()), ("pca", PCA()), ("clf", SVC())], memory=cache)
        if tool == "quiver":
            from pipelines.sklearn import GridSearchCV

            s = GridSearchCV(pipe, grid, cv=5, progress=False).fit(X, y)
            st = s.quiver_result_.stats
            extra = {"breakdown": {k: st.get(k) for k in ("compile_seconds", "cluster", "worker_start", "bridge", "bridge_tasks", "spread_tasks", "cluster_seconds",
                                                           "wall_seconds", "busy_fraction", "executed_tasks")}}
        elif tool == "dask_ml":
            import dask_ml.model_selection as dms

            if "client" not in state:
                state["cluster"], state["client"] = _cluster()
            s = dms.GridSearchCV(pipe, grid, cv=5, scheduler=state["client"]).fit(X, y)
            extra = {}
        else:
            from sklearn.model_selection import GridSearchCV

            s = GridSearchCV(pipe, grid, cv=5, n_jobs=2).fit(X, y)
            extra = {}
        return {"score": float(s.best_score_), "test": None, **extra}

    def close():
        if "client" in state:
            state["client"].close()
            state["cluster"].close()
        if tool == "quiver":
            from graph.cluster.embedded import close_kept

            close_kept()
    return call, close


def _torch12(tool: str, quick: bool):
    sys.path.insert(0, str(HERE))
    import train_explore as TE

    size = TE.sizes(quick)
    name = "quiver_halving" if tool == "quiver" else "optuna_sha"

    def call():
        out = TE.METHODS[name][1](name, size)
        return {"score": out["chosen"]["accuracy"], "test": None, "inner_wall_s": out["wall_s"],
                "epochs": sum(t["iterations"] for t in out["trials"]),
                "breakdown": out.get("stats")}

    def close():
        from graph.cluster.embedded import close_kept

        close_kept()
    return call, close


def _time_steps(repeats: int = 3) -> dict:
    """Seconds (best of ``repeats``) of each STEPCOST model step on the grid112 table, here."""
    import common_cases_steps as S

    data = S.pca(S.scale(S.load_table(0), "standard"), 16)
    out = {}
    for kind, value in STEPCOST:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            S.STEPS[kind](data, value)
            best = min(best, time.perf_counter() - t)
        out[f"{kind}({value})"] = best
    return out


def stepcost(tool: str) -> dict:
    """The same step calls in a plain process, in a Quiver embedded worker, in a plain Dask worker."""
    if tool == "plain":
        return _time_steps()
    if tool == "quiver_worker":
        from graph.cluster.connect import connect

        with connect(None, n_workers=1, quiet=True) as c:
            return c.submit(_time_steps, pure=False).result()
    cluster, c = _cluster()
    try:
        return c.submit(_time_steps, pure=False).result()
    finally:
        c.close()
        cluster.close()


def one(workload: str, tool: str, quick: bool) -> dict:
    """Run one (workload, tool) in this process: the first call (with the close at the end), then a second."""
    sys.path.insert(0, str(HERE))
    import common_cases_steps as S  # noqa: F401  (imported before the clock, as a script's top does)
    import distributed  # noqa: F401
    import sklearn.model_selection  # noqa: F401

    import pipelines  # noqa: F401

    if workload == "stepcost":
        return {"steps": stepcost(tool)}
    if tool in ("quiver_nobridge", "quiver_nospread"):  # Quiver without its bridge (graph/cluster/bridge.py)
        import dask                                        # or its sibling spread (graph/run/spread.py)

        dask.config.set({"quiver.embedded-cluster.bridge" if tool == "quiver_nobridge" else "quiver.spread-ready": False})
        tool = "quiver"
    if quick:
        S.GRID112 = {"scaler": ["standard", "minmax"], "features": [("pca", 8), ("kbest", 8)],
                     "model": [("logreg", 1.0), ("hgb", 0.2)]}
        S.DIGITS = {"scaler": ["standard"], "features": [("poly_pca", 16)], "model": [("logreg", 1.0), ("svc", 1.0)]}
    spec, load = {"grid112": (S.GRID112, S.load_table), "digits": (S.DIGITS, S.load_digits_split)}.get(workload, (None, None))
    close = None
    t0 = time.perf_counter()  # torch12: the clock includes importing torch (and Optuna), as issue 23 measured
    if workload == "dropin36":
        call, close = _dropin(tool)
    elif workload == "torch12":
        call, close = _torch12(tool, quick)
    elif tool == "quiver":
        call = _quiver_explore(S, spec, load)
    elif tool == "dask_compute":
        call, close = _dask_compute(S, spec, load)
    else:
        call, close = _sk_search(S, spec, load, memory=tool == "sklearn_memory", dask_ml=tool == "dask_ml")
    if workload != "torch12":
        t0 = time.perf_counter()
    first = call()
    t_first = time.perf_counter() - t0
    t1 = time.perf_counter()
    second = call()
    t_second = time.perf_counter() - t1
    t2 = time.perf_counter()
    if close is not None:
        close()
    elif tool == "quiver":
        from graph.cluster.embedded import close_kept

        close_kept()
    t_close = time.perf_counter() - t2
    return {"first_s": t_first + t_close, "second_s": t_second, "close_s": t_close, "first": first, "second": second}


# ----------------------------------------------------------------------------- driver (parent)


def _child(workload: str, tool: str, quick: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", workload, tool] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:300] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(xs):
    return statistics.median(xs) if xs else None


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if ok and "steps" in ok[0]:
        return {"repeats": len(runs), "errors": [r["error"] for r in runs if "error" in r],
                "steps": {k: _median([r["steps"][k] for r in ok]) for k in ok[0]["steps"]}}
    out = {"repeats": len(runs), "errors": [r["error"] for r in runs if "error" in r]}
    for part in ("first_s", "second_s", "close_s"):
        xs = [r[part] for r in ok]
        out[part] = {"median": _median(xs), "min": min(xs) if xs else None, "max": max(xs) if xs else None, "all": xs}
    if ok:
        out["score"] = ok[0]["first"]["score"]
        out["test"] = ok[0]["first"].get("test")
        b = [r["first"].get("breakdown") for r in ok if r["first"].get("breakdown")]
        if b:
            keys = [k for k, v in b[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            out["breakdown_first"] = {k: _median([x[k] for x in b if x.get(k) is not None]) for k in keys}
            out["worker_start"] = sorted({str(x.get("worker_start")) for x in b})  # forkserver or spawn
            out["bridge"] = sorted({str(x.get("bridge")) for x in b})  # the first call began in the script's process
        b2 = [r["second"].get("breakdown") for r in ok if r["second"].get("breakdown")]
        if b2:
            keys = [k for k, v in b2[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            out["breakdown_second"] = {k: _median([x[k] for x in b2 if x.get(k) is not None]) for k in keys}
        if "epochs" in ok[0]["first"]:
            out["epochs"] = [r["first"]["epochs"] for r in ok]
    return out


def _fmt(m: dict | None) -> str:
    if not m or m.get("median") is None:
        return "-"
    return f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})"


def print_table(results: dict) -> None:
    for workload, tools in results["workloads"].items():
        if workload == "stepcost":
            print("\n## stepcost: one step's seconds (best of 3, median over processes)")
            names = list(next(iter(tools.values())).get("steps", {}))
            print("| where | " + " | ".join(names) + " |")
            print("|---|" + "---|" * len(names))
            plain = tools.get("plain", {}).get("steps", {})
            for tool, s in tools.items():
                cells = [f"{s['steps'][n]:.3f}" + (f" ({s['steps'][n] / plain[n]:.2f}x)" if plain.get(n) else "")
                         for n in names] if s.get("steps") else ["-"] * len(names)
                print(f"| {tool} | " + " | ".join(cells) + " |")
            continue
        print(f"\n## {workload}")
        print("| tool | first call s, median (min-max) | second call s | best validation score | Quiver ÷ best plain (first / second) |")
        print("|---|---|---|---|---|")
        plain = [t for t in tools if not t.startswith("quiver") and tools[t].get("first_s", {}).get("median")]
        best1 = min((tools[t]["first_s"]["median"] for t in plain), default=None)
        best2 = min((tools[t]["second_s"]["median"] for t in plain), default=None)
        for tool, s in tools.items():
            ratio = ""
            if tool.startswith("quiver") and best1 and s["first_s"]["median"]:
                ratio = f"{s['first_s']['median'] / best1:.2f} / {s['second_s']['median'] / best2:.2f}"
            score = s.get("score")
            err = f" ERRORS: {s['errors']}" if s.get("errors") else ""
            print(f"| {tool} | {_fmt(s.get('first_s'))} | {_fmt(s.get('second_s'))} | "
                  f"{'-' if score is None else f'{score:.4f}'} | {ratio}{err} |")
        q = tools.get("quiver", {})
        for part in ("breakdown_first", "breakdown_second"):
            if q.get(part):
                print(f"Quiver {part.split('_')[1]} call: " + ", ".join(
                    f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in q[part].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=None, help="fresh processes per (workload, tool); default 5 (1 with --quick)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--tools", default=None, help="comma-separated subset of the tools")
    ap.add_argument("--quick", action="store_true", help="smoke test: small grids, 1 repeat")
    ap.add_argument("--out", default=None, help=f"JSON path (default {RESULTS.relative_to(ROOT)}; --quick: not written)")
    ap.add_argument("--one", nargs=2, metavar=("WORKLOAD", "TOOL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(*args.one, quick=args.quick)))
        return 0
    repeats = args.repeats or (1 if args.quick else 5)
    chosen = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    tools_wanted = args.tools.split(",") if args.tools else None
    results: dict = {"repeats": repeats, "quick": args.quick, "machine": platform.platform(),
                     "cpus": os.cpu_count(), "load_before": os.getloadavg(), "workloads": {}}
    for workload in chosen:
        tools = [t for t in WORKLOADS[workload] if tools_wanted is None or t in tools_wanted]
        runs: dict = {t: [] for t in tools}
        for r in range(repeats):  # tools interleaved, so a busy minute hits them alike
            for tool in tools:
                runs[tool].append(_child(workload, tool, args.quick))
                last = runs[tool][-1]
                print(f"[{workload} {r + 1}/{repeats}] {tool}: "
                      + (last.get("error") or (json.dumps(last["steps"]) if "steps" in last else
                                               f"first {last['first_s']:.2f} s, second {last['second_s']:.2f} s")),
                      flush=True)
        results["workloads"][workload] = {t: summarise(runs[t]) for t in tools}
    results["load_after"] = os.getloadavg()
    print_table(results)
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    if out:
        out.write_text(json.dumps(results, indent=1, default=str))
        print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
