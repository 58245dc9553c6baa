"""Benchmark: the memory planner on ordinary Dask code (issue 46).

    python benchmarks/memory_corpus.py                       # every workload at 1.4x the cluster's memory
    python benchmarks/memory_corpus.py --workloads a --repeats 3
    python benchmarks/memory_corpus.py --times-cluster 10 --workloads a,e --repeats 1
    python benchmarks/memory_corpus.py --size 1 --workloads a  # issue 46's ridge at its own size (745 MiB)
    python benchmarks/memory_corpus.py --small               # a CI-sized smoke run of every workload

A corpus of explorations written the way Dask's own documentation writes ``dask.array`` and
``dask.dataframe`` code: slicing, ``da.concatenate``, ``@``, ``rechunk``, ``da.where``, reductions,
``dd.read_parquet`` of real files, ``fillna`` with means, ``categorize`` + ``get_dummies``,
``groupby().agg()`` + ``merge``; ``map_blocks`` only where a user would write it (a small solve).

(a) ridge: the exploration of issue 46 as written there: a ``lazy`` source of 80 seeded
    ``da.from_delayed`` chunks (20,000 x 61 float64 each: 745 MiB at ``--size 1``, more chunks
    at other sizes), 3 cleanings x 2 feature sets x 3 ridge alphas (closed form, accuracy metric).
(b) arrays: ``rechunk``, ``@``/``tensordot``, reductions over both axes and ``da.where``.
(c) frame: ``dd.read_parquet``, column arithmetic, ``fillna`` with means, ``categorize`` +
    ``get_dummies``, a split by a column, a linear model from partial sums.
(d) groupby: ``groupby(...).agg(...)`` features ``merge``d back (a shuffle) before the model.
(e) expand: one branch's intermediate much larger than the source (feature expansion) beside
    branches where it is smaller.

Each workload runs twice on a fresh 2 x 640 MiB cluster each, alternating: Quiver with
``memory_budget`` = the cluster's memory, and one plain ``dask.compute`` of the same branches.
Recorded per run: wall, bytes Dask spilled (the workers' own counters) and why, executed /
unique tasks, peak memory (sum of the workers' process memory), the plan's predicted peak and
planned spill, and the branch chosen (Quiver's; plain Dask's by the same metric). Results go to
``benchmarks/results/memory_corpus.json`` (``--output`` to change).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread everywhere: both methods on exactly the same cores

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
MiB = 2**20
WORKER_MEMORY = 640 * MiB
WORKERS = 2
CLUSTER = WORKERS * WORKER_MEMORY


def _here():
    """This module by its importable name: Dask ships its functions by reference."""
    return importlib.import_module("benchmarks.memory_corpus")


# ---------------------------------------------------------------- (a) ridge, as issue 46 wrote it

RIDGE_COLS = 61  # 60 features and a 0/1 label
TABLE = 80 * 20_000 * RIDGE_COLS * 8  # issue 46's table (745 MiB): --size 1.0


def ridge_chunk(seed: int, i: int, rows: int) -> np.ndarray:
    """One seeded chunk: 60 heavy-tailed features and a 0/1 label (the last column)."""
    rng = np.random.default_rng([seed, i])
    x = rng.standard_t(4, size=(rows, RIDGE_COLS - 1))
    score = x[:, :10] @ np.linspace(1.0, -0.5, 10) + 0.3 * np.sign(x[:, 10]) * np.log1p(abs(x[:, 10]))
    y = (score + rng.standard_normal(rows) > 0).astype(float)
    return np.concatenate([x, y[:, None]], axis=1)


def ridge_source(chunks: int = 80, rows: int = 20_000, seed: int = 0):
    """``lazy``: the table as a user builds it from a generator: ``da.from_delayed`` per chunk."""
    import dask
    import dask.array as da

    make = dask.delayed(_here().ridge_chunk)
    parts = [da.from_delayed(make(seed, i, rows), shape=(rows, RIDGE_COLS), dtype=float) for i in range(chunks)]
    return da.concatenate(parts, axis=0)


def clean_none(a):
    return a


def clean_clip(a):
    import dask.array as da

    return da.concatenate([da.clip(a[:, :-1], -3, 3), a[:, -1:]], axis=1)


def clean_signlog(a):
    import dask.array as da

    x = a[:, :-1]
    return da.concatenate([da.sign(x) * da.log1p(abs(x)), a[:, -1:]], axis=1)


def features(a, kind: str):
    import dask.array as da

    if kind == "columns":
        return a
    x = a[:, :-1]
    return da.concatenate([x, x[:, :10] ** 2, a[:, -1:]], axis=1)


def ridge(a, alpha: float):
    """Ridge in closed form with an intercept; accuracy of ``prediction > 0.5`` on the last 20%."""
    import dask.array as da

    n = a.shape[0]
    x, y = a[:, :-1], a[:, -1]
    x = da.concatenate([da.ones((n, 1), chunks=(x.chunks[0], 1)), x], axis=1)
    p = x.shape[1]
    cut = int(n * 0.8)
    xt, yt, xv, yv = x[:cut], y[:cut], x[cut:], y[cut:]
    gram = (xt.T @ xt).rechunk((p, p)) + alpha * da.eye(p, chunks=p)
    rhs = (xt.T @ yt).rechunk(p)
    w = da.map_blocks(np.linalg.solve, gram, rhs, drop_axis=1, dtype=float)
    return {"accuracy": (((xv @ w) > 0.5) == yv).mean()}


RIDGE_ALPHAS = (0.1, 1e3, 1e5)


def ridge_pipeline(chunks: int, rows: int):
    from pipelines import Pipeline, grid, lazy

    m = _here()
    return (Pipeline("ridge").source(lazy(m.ridge_source), chunks=chunks, rows=rows)
            .explore("cleaning", m.clean_none, m.clean_clip, m.clean_signlog)
            .explore("features", grid(m.features, kind=["columns", "squares"]))
            .explore("model", grid(m.ridge, alpha=list(RIDGE_ALPHAS)))
            .choose("accuracy", mode="max"))


def ridge_branches(chunks: int, rows: int) -> dict:
    m = _here()
    src = m.ridge_source(chunks, rows)
    out = {}
    for cname, clean in (("clean_none", m.clean_none), ("clean_clip", m.clean_clip), ("clean_signlog", m.clean_signlog)):
        c = clean(src)
        for kind in ("columns", "squares"):
            f = m.features(c, kind)
            for a in RIDGE_ALPHAS:
                out[(cname, kind, a)] = m.ridge(f, a)["accuracy"]
    return out


def ridge_row_key(row) -> tuple:
    return (row["cleaning"], row["features.kind"], float(row["model.alpha"]))


WORKLOADS: dict = {}


def _ridge(size: float) -> dict:
    rows = 20_000
    # size 1.0 = issue 46's table: 80 chunks of 20,000 x 61 float64 (745 MiB)
    chunks = max(2, int(round(80 * size)))
    return {"pipeline": lambda: ridge_pipeline(chunks, rows), "branches": lambda: ridge_branches(chunks, rows),
            "row_key": ridge_row_key, "metric": "accuracy", "mode": "max",
            "data_bytes": chunks * rows * RIDGE_COLS * 8, "describe": f"{chunks} x {rows:,} x {RIDGE_COLS} float64"}


WORKLOADS["a"] = ("ridge", _ridge)


# ---------------------------------------------------------------- (b) arrays: rechunk, @, both axes, da.where

ARRAY_COLS = 100
ARRAY_ROWS = 12_500  # per chunk: 9.5 MiB


def array_source(chunks: int, seed: int = 1):
    """``lazy``: a seeded random table, as Dask's docs make one."""
    import dask.array as da

    rng = da.random.default_rng(seed)
    return rng.standard_normal((chunks * ARRAY_ROWS, ARRAY_COLS), chunks=(ARRAY_ROWS, ARRAY_COLS))


def winsorize(x):
    import dask.array as da

    return da.where(abs(x) > 2.5, 2.5 * da.sign(x), x)


def centre(x):
    return x - x.mean(axis=0)


def row_normalise(x):
    import dask.array as da

    return x / da.sqrt((x ** 2).sum(axis=1, keepdims=True))


def project(x, kind: str):
    """``columns``: as they are; ``projection``: rechunked to half the rows per chunk and
    projected onto 30 seeded directions (``@``)."""
    import dask.array as da

    if kind == "columns":
        return x
    r = da.random.default_rng(7).standard_normal((x.shape[1], 30), chunks=(x.shape[1], 30))
    return x.rechunk((ARRAY_ROWS // 2, x.shape[1])) @ r


def _top_share(gram, k):
    ev = np.linalg.eigvalsh(gram)[::-1]
    return np.array(ev[:k].sum() / ev.sum())


def spectrum(x, k: int):
    """The share of variance in the top ``k`` directions, from ``tensordot`` of the table with itself."""
    import dask.array as da

    p = x.shape[1]
    gram = da.tensordot(x, x, axes=(0, 0)).rechunk((p, p))
    return {"share": da.map_blocks(_top_share, gram, k, drop_axis=[0, 1], dtype=float)}


def arrays_pipeline(chunks: int):
    from pipelines import Pipeline, grid, lazy

    m = _here()
    return (Pipeline("arrays").source(lazy(m.array_source), chunks=chunks)
            .explore("cleaning", m.winsorize, m.centre, m.row_normalise)
            .explore("features", grid(m.project, kind=["columns", "projection"]))
            .explore("model", grid(m.spectrum, k=[5, 10]))
            .choose("share", mode="max"))


def arrays_branches(chunks: int) -> dict:
    m = _here()
    src = m.array_source(chunks)
    out = {}
    for clean in (m.winsorize, m.centre, m.row_normalise):
        c = clean(src)
        for kind in ("columns", "projection"):
            f = m.project(c, kind)
            for k in (5, 10):
                out[(clean.__name__, kind, k)] = m.spectrum(f, k)["share"]
    return out


def _arrays(size: float) -> dict:
    chunks = max(2, int(round(size * TABLE / (ARRAY_ROWS * ARRAY_COLS * 8))))
    return {"pipeline": lambda: arrays_pipeline(chunks), "branches": lambda: arrays_branches(chunks),
            "row_key": lambda row: (row["cleaning"], row["features.kind"], int(row["model.k"])),
            "metric": "share", "mode": "max", "data_bytes": chunks * ARRAY_ROWS * ARRAY_COLS * 8,
            "describe": f"{chunks} x {ARRAY_ROWS:,} x {ARRAY_COLS} float64 (seeded)"}


# ---------------------------------------------------------------- (c), (d) frames from Parquet

FRAME_ROWS = 80_000  # per file: ~10 MiB in memory
FRAME_X = 14
STORES = 500


def write_parquet(files: int, root: Path) -> Path:
    """Seeded Parquet files (written once per size under ``root``): 14 float features with 5%
    missing, a category, a store id, a train/validation split column and a target."""
    import pandas as pd

    path = root / f"frame-{files}"
    if (path / "_done").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        rng = np.random.default_rng([3, i])
        x = rng.standard_normal((FRAME_ROWS, FRAME_X))
        store = rng.integers(0, STORES, FRAME_ROWS)
        cat = rng.integers(0, 6, FRAME_ROWS)
        y = x[:, :5] @ np.linspace(1, -1, 5) + 0.3 * cat + 0.01 * (store % 17) + rng.standard_normal(FRAME_ROWS)
        x[rng.random(x.shape) < 0.05] = np.nan
        df = pd.DataFrame(x, columns=[f"x{j}" for j in range(FRAME_X)])
        df["cat"] = pd.Categorical.from_codes(cat, list("abcdef")).astype(str)
        df["store"] = store
        df["split"] = np.where(rng.random(FRAME_ROWS) < 0.2, "valid", "train")
        df["y"] = y
        df.to_parquet(path / f"part-{i:05d}.parquet")
    (path / "_done").touch()
    return path


def read_frame(path: str):
    """``lazy``: the Parquet files."""
    import dask.dataframe as dd

    return dd.read_parquet(path)


XCOLS = [f"x{j}" for j in range(FRAME_X)]


def fill_means(df):
    return df.fillna(df[XCOLS].mean())


def fill_zero(df):
    return df.fillna({c: 0.0 for c in XCOLS})


def frame_features(df, kind: str):
    """Column arithmetic; ``dummies``: the category one-hot encoded (``get_dummies`` on a category
    with known levels, as ``categorize`` would make it)."""
    import dask.dataframe as dd
    import pandas as pd

    df = df.assign(x0_x1=df.x0 * df.x1, x2_sq=df.x2 ** 2)
    if kind == "dummies":
        df = dd.get_dummies(df.astype({"cat": pd.CategoricalDtype(list("abcdef"))}), columns=["cat"], dtype=float)
    return df


def _numeric(df):
    return [c for c in df.columns if c not in ("cat", "store", "split", "y")]


def frame_fit(df, alpha: float):
    """Ridge from the training rows' partial sums (``X.T @ X`` over the partitions); validation MSE."""
    import dask.array as da

    cols = _numeric(df)
    p = len(cols)
    # X and y from one selection: read apart, Dask may fuse a frame's files differently per column set
    train = df[df.split == "train"][cols + ["y"]].to_dask_array()
    valid = df[df.split == "valid"][cols + ["y"]].to_dask_array()
    xt, yt = train[:, :p], train[:, p]
    gram = (xt.T @ xt).rechunk((p, p)) + alpha * da.eye(p, chunks=p)
    w = da.map_blocks(np.linalg.solve, gram, (xt.T @ yt).rechunk(p), drop_axis=1, dtype=float)
    err = valid[:, :p] @ w - valid[:, p]
    return {"mse": (err ** 2).mean()}


def frame_pipeline(path: str):
    from pipelines import Pipeline, grid, lazy

    m = _here()
    return (Pipeline("frame").source(lazy(m.read_frame), path=path)
            .explore("cleaning", m.fill_means, m.fill_zero)
            .explore("features", grid(m.frame_features, kind=["numeric", "dummies"]))
            .explore("model", grid(m.frame_fit, alpha=[0.1, 100.0]))
            .choose("mse", mode="min"))


def frame_branches(path: str) -> dict:
    m = _here()
    src = m.read_frame(path)
    out = {}
    for clean in (m.fill_means, m.fill_zero):
        c = clean(src)
        for kind in ("numeric", "dummies"):
            f = m.frame_features(c, kind)
            for a in (0.1, 100.0):
                out[(clean.__name__, kind, a)] = m.frame_fit(f, a)["mse"]
    return out


def store_features(df, by: str):
    """Per-group aggregates (``groupby(...).agg(...)``) merged back onto every row (a shuffle)."""
    import dask.dataframe as dd

    key = df.store % 50 if by == "region" else df.store
    df = df.assign(group=key)
    agg = df.groupby("group").agg({"x0": "mean", "x1": "std", "y": "mean"})
    agg.columns = [f"g_{c}" for c in agg.columns]
    agg = agg.reset_index().repartition(npartitions=4)
    return dd.merge(df, agg, on="group", how="left", shuffle_method="tasks").drop(columns=["group"])


def groupby_pipeline(path: str):
    from pipelines import Pipeline, grid, lazy

    m = _here()
    return (Pipeline("groupby").source(lazy(m.read_frame), path=path)
            .explore("cleaning", m.fill_zero)
            .explore("features", grid(m.store_features, by=["store", "region"]))
            .explore("model", grid(m.frame_fit, alpha=[0.1, 100.0]))
            .choose("mse", mode="min"))


def groupby_branches(path: str) -> dict:
    m = _here()
    c = m.fill_zero(m.read_frame(path))
    out = {}
    for by in ("store", "region"):
        f = m.store_features(c, by)
        for a in (0.1, 100.0):
            out[("fill_zero", by, a)] = m.frame_fit(f, a)["mse"]
    return out


FRAME_BYTES = FRAME_ROWS * (FRAME_X * 8 + 8 + 8 + 60 + 60)  # about what pandas holds per file


def _frames(size: float, which: str) -> dict:
    files = max(2, int(round(size * TABLE / FRAME_BYTES)))
    root = Path(os.environ.get("QUIVER_CORPUS_DIR", Path(tempfile.gettempdir()) / "quiver-memory-corpus"))
    lazy_path: dict = {}

    def path() -> str:
        if "p" not in lazy_path:
            lazy_path["p"] = str(write_parquet(files, root))
        return lazy_path["p"]

    if which == "frame":
        return {"pipeline": lambda: frame_pipeline(path()), "branches": lambda: frame_branches(path()),
                "row_key": lambda row: (row["cleaning"], row["features.kind"], float(row["model.alpha"])),
                "metric": "mse", "mode": "min", "data_bytes": files * FRAME_BYTES,
                "describe": f"{files} Parquet files x {FRAME_ROWS:,} rows"}
    return {"pipeline": lambda: groupby_pipeline(path()), "branches": lambda: groupby_branches(path()),
            "row_key": lambda row: ("fill_zero", row["features.by"], float(row["model.alpha"])),
            "metric": "mse", "mode": "min", "data_bytes": files * FRAME_BYTES,
            "describe": f"{files} Parquet files x {FRAME_ROWS:,} rows"}


# ---------------------------------------------------------------- (e) expand: one branch much larger

EXPAND_COLS = 21  # 20 features and a target


def expand_source(chunks: int, rows: int = 40_000, seed: int = 5):
    """``lazy``: seeded chunks from ``from_delayed``, 20 features and a target."""
    import dask
    import dask.array as da

    make = dask.delayed(_here().expand_chunk)
    return da.concatenate([da.from_delayed(make(seed, i, rows), shape=(rows, EXPAND_COLS), dtype=float)
                           for i in range(chunks)], axis=0)


def expand_chunk(seed: int, i: int, rows: int) -> np.ndarray:
    rng = np.random.default_rng([seed, i])
    x = rng.standard_normal((rows, EXPAND_COLS - 1))
    y = x[:, 0] * x[:, 1] + x[:, 2] - 0.5 * x[:, 3] ** 2 + rng.standard_normal(rows)
    return np.concatenate([x, y[:, None]], axis=1)


def expand_features(a, kind: str):
    """``pairs``: every product of two features (210 columns: 10x the source); ``first5``: five
    columns; ``project``: three seeded directions."""
    import dask.array as da

    x, y = a[:, :-1], a[:, -1:]
    if kind == "pairs":
        i, j = np.triu_indices(x.shape[1])
        return da.concatenate([x, x[:, i] * x[:, j], y], axis=1)
    if kind == "first5":
        return da.concatenate([x[:, :5], y], axis=1)
    r = da.random.default_rng(11).standard_normal((x.shape[1], 3), chunks=(x.shape[1], 3))
    return da.concatenate([x @ r, y], axis=1)


def expand_ridge(a, alpha: float):
    """Ridge in closed form; validation MSE on the last 20% of the rows."""
    import dask.array as da

    n = a.shape[0]
    x, y = a[:, :-1], a[:, -1]
    p = x.shape[1]
    cut = int(n * 0.8)
    gram = (x[:cut].T @ x[:cut]).rechunk((p, p)) + alpha * da.eye(p, chunks=p)
    w = da.map_blocks(np.linalg.solve, gram, (x[:cut].T @ y[:cut]).rechunk(p), drop_axis=1, dtype=float)
    return {"mse": ((x[cut:] @ w - y[cut:]) ** 2).mean()}


def expand_pipeline(chunks: int):
    from pipelines import Pipeline, grid, lazy

    m = _here()
    return (Pipeline("expand").source(lazy(m.expand_source), chunks=chunks)
            .explore("features", grid(m.expand_features, kind=["pairs", "first5", "project"]))
            .explore("model", grid(m.expand_ridge, alpha=[0.1, 10.0]))
            .choose("mse", mode="min"))


def expand_branches(chunks: int) -> dict:
    m = _here()
    src = m.expand_source(chunks)
    out = {}
    for kind in ("pairs", "first5", "project"):
        f = m.expand_features(src, kind)
        for a in (0.1, 10.0):
            out[(kind, a)] = m.expand_ridge(f, a)["mse"]
    return out


def _expand(size: float) -> dict:
    # the data here is the largest intermediate: the pairs branch's 230 columns, 11x the source
    per = 40_000 * (EXPAND_COLS - 1 + 210 + 1) * 8
    chunks = max(2, int(round(size * TABLE / per)))
    return {"pipeline": lambda: expand_pipeline(chunks), "branches": lambda: expand_branches(chunks),
            "row_key": lambda row: (row["features.kind"], float(row["model.alpha"])),
            "metric": "mse", "mode": "min", "data_bytes": chunks * per,
            "describe": f"{chunks} x 40,000 x {EXPAND_COLS} float64, expanded to 231 columns in one branch"}


WORKLOADS["b"] = ("arrays", _arrays)
WORKLOADS["c"] = ("frame", lambda size: _frames(size, "frame"))
WORKLOADS["d"] = ("groupby", lambda size: _frames(size, "groupby"))
WORKLOADS["e"] = ("expand", _expand)


# ---------------------------------------------------------------- running

def _fresh_cluster():
    from distributed import Client, LocalCluster

    lc = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", memory_limit=WORKER_MEMORY)
    return lc, Client(lc)


def _causes(client) -> dict:
    from benchmarks.collections_explore import spill_causes

    out: dict = {}
    for per in client.run(spill_causes).values():
        for k, v in per.items():
            out[k] = out.get(k, 0) + int(v)
    return out


PLAN_STATS = ("working_memory", "monitor_spilled_bytes", "target_spilled_bytes", "recompute_seconds", "predicted_recompute_seconds", "planned_views", "predicted_peak_bytes", "predicted_spill_bytes", "planned_spill", "planned_recompute", "planned_keep",
              "recomputed_tasks", "second_pass_copies", "memory_plan_note", "worker_pauses", "naive_tasks",
              "unique_tasks", "executed_tasks", "peak_prediction_ratio", "disk_bandwidth", "memory_plan_installed",
              "planned_spill_bytes", "monitor_spilled_bytes", "recompute_seconds", "memory_why")


def run_one(method: str, w: dict, budget: int) -> dict:
    """One method on a fresh cluster: measured and the branch it chose."""
    import dask

    from benchmarks.collections_explore import Measured

    lc, client = _fresh_cluster()
    try:
        with Measured(client) as meas:
            if method == "dask":
                branches = w["branches"]()
                values = dict(zip(branches, map(float, dask.compute(*branches.values()))))
                extra: dict = {}
            else:
                r = w["pipeline"]().run(client, memory_budget=budget, progress=False, quiet=True,
                                        **({"order": "dask"} if method == "quiver_dask_order" else {}))
                values = {w["row_key"](row): float(row[w["metric"]]) for _, row in r.table.iterrows()}
                extra = {k: r.stats.get(k) for k in PLAN_STATS if k in r.stats}
                if r.memory_plan is not None:
                    extra["plan_text_head"] = str(r.memory_plan).splitlines()[:4]
        res = dict(meas.result, **extra, spill_causes=_causes(client))
    finally:
        for close in (client.close, lc.close):
            try:
                close()
            except Exception as exc:  # recorded: a slow close on a loaded machine; the run's numbers are in
                print(f"    (closing the cluster: {type(exc).__name__}: {exc})", flush=True)
    pick = max if w["mode"] == "max" else min
    res["chosen"] = str(pick(values, key=values.get))
    res["metric_values"] = {str(k): v for k, v in values.items()}
    return res


def summarise(name: str, w: dict, budget: int, runs: dict) -> dict:
    data = w["data_bytes"]
    must_leave = max(0, data - budget)
    q, d = runs["quiver"], runs["dask"]
    med = lambda rs, k: statistics.median(r[k] for r in rs) if rs else None  # noqa: E731
    row = {
        "workload": name, "data_bytes": data, "budget": budget, "must_leave_bytes": must_leave,
        "quiver_wall_s": med(q, "wall_s"), "dask_wall_s": med(d, "wall_s"),
        "quiver_wall_range": [min(r["wall_s"] for r in q), max(r["wall_s"] for r in q)] if q else None,
        "dask_wall_range": [min(r["wall_s"] for r in d), max(r["wall_s"] for r in d)] if d else None,
        "quiver_spilled": med(q, "spilled_bytes"), "dask_spilled": med(d, "spilled_bytes"),
        "quiver_peak": med(q, "peak_memory_bytes"), "dask_peak": med(d, "peak_memory_bytes"),
        "predicted_peak": med([r for r in q if r.get("predicted_peak_bytes")], "predicted_peak_bytes") if q else None,
        "quiver_executed": med(q, "executed_tasks"), "quiver_unique": med(q, "distinct_keys"),
        "dask_executed": med(d, "executed_tasks"),
        "same_choice": bool(q and d and q[0]["chosen"] == d[0]["chosen"]),
    }
    if q and d:
        row["wall_ratio"] = row["quiver_wall_s"] / row["dask_wall_s"]
        row["targets"] = {
            "spilled <= 2x must leave": row["quiver_spilled"] <= 2 * must_leave + 16 * MiB,
            "spilled <= plain dask": row["quiver_spilled"] <= max(row["dask_spilled"], 16 * MiB),
            "wall <= 1.0x plain dask": row["wall_ratio"] <= 1.0,
            "same choice": row["same_choice"],
            "peak within budget": row["quiver_peak"] <= budget,
            "predicted peak within 25%": bool(row["predicted_peak"])
            and abs(row["quiver_peak"] / row["predicted_peak"] - 1) <= 0.25,
            "executed <= 1.1x unique": row["quiver_executed"] <= 1.1 * row["quiver_unique"],
        }
    return row


def markdown(rows: list) -> str:
    """The corpus table (docs/guide/memory.md, the README): one row per workload, met or not."""
    from dask.utils import format_bytes

    def mib(n):
        return "-" if n is None else format_bytes(int(n))

    head = ("| workload | data / budget | spilled: Quiver / plain Dask (must leave) | wall s: Quiver / plain (ratio) "
            "| peak (predicted) | executed / unique | same choice | targets met |\n|---|---|---|---|---|---|---|---|")
    out = [head]
    for r in rows:
        t = r.get("targets", {})
        met = sum(bool(v) for v in t.values())
        missed = ", ".join(k for k, v in t.items() if not v)
        out.append(
            f"| {r['workload']} | {mib(r['data_bytes'])} / {mib(r['budget'])} | {mib(r['quiver_spilled'])} / "
            f"{mib(r['dask_spilled'])} ({mib(r['must_leave_bytes'])}) | {r['quiver_wall_s'] or 0:.1f} / "
            f"{r['dask_wall_s'] or 0:.1f} ({r.get('wall_ratio') or 0:.2f}x) | {mib(r['quiver_peak'])} "
            f"({mib(r['predicted_peak'])}) | {r['quiver_executed']:.0f} / {r['quiver_unique']:.0f} | "
            f"{'yes' if r['same_choice'] else 'NO'} | {met}/{len(t)}" + (f" (missed: {missed})" if missed else "") + " |")
    return "\n".join(out)


def _write(args, budget: int, rows: list, all_runs: dict) -> Path:
    out = args.output or RESULTS / ("memory_corpus.small.json" if args.small else "memory_corpus.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "memory_corpus", "worker_memory": WORKER_MEMORY, "workers": WORKERS,
                               "budget": budget, "rows": rows, "runs": all_runs,
                               "load_average_end": os.getloadavg()[0], "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                              indent=2, default=str) + "\n")
    return out


def main(argv=None) -> int:
    from dask.utils import format_bytes

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--size", type=float, default=None,
                    help="data size relative to issue 46's sizes (1.0 = its 745 MiB ridge table); default 1.4x the cluster")
    ap.add_argument("--times-cluster", type=float, default=None,
                    help="data size as a multiple of the cluster's memory (1.4 by default; ~10 for the large runs)")
    ap.add_argument("--small", action="store_true", help="a CI-sized smoke run")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--methods", default="quiver,dask")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, help="print the markdown table of a results JSON and exit")
    args = ap.parse_args(argv)
    if args.table is not None:
        print(markdown(json.loads(args.table.read_text())["rows"]))
        return 0
    budget = CLUSTER
    methods = args.methods.split(",")
    rows, all_runs = [], {}
    print(f"memory_corpus: 2 workers x {format_bytes(WORKER_MEMORY)}, budget {format_bytes(budget)}; load average "
          f"{os.getloadavg()[0]:.1f} (a shared machine skews walls)", flush=True)
    for wid in args.workloads.split(","):
        name, make = WORKLOADS[wid]
        if args.small:
            size = 0.05
        elif args.size is not None:
            size = args.size
        else:
            size = (args.times_cluster or 1.4) * CLUSTER / TABLE
        w = make(size)
        print(f"({wid}) {name}: {w['describe']} = {format_bytes(w['data_bytes'])}", flush=True)
        runs: dict = {m: [] for m in ("quiver", "dask", *methods)}
        for rep in range(args.repeats):
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                res = run_one(m, w, budget)
                runs[m].append(res)
                print(f"  {m:<7} run {rep + 1}: {res['wall_s']:.1f}s, spilled {format_bytes(res['spilled_bytes'])}, "
                      f"peak {format_bytes(res['peak_memory_bytes'])}, executed {res['executed_tasks']} / unique "
                      f"{res['distinct_keys']}, predicted peak {format_bytes(res.get('predicted_peak_bytes') or 0)}, "
                      f"planned spill {format_bytes(res.get('predicted_spill_bytes') or 0)}, chose {res['chosen']}; "
                      f"causes (MiB) { {k: round(v / MiB) for k, v in sorted(res['spill_causes'].items())} }", flush=True)
                if res.get("memory_plan_note"):
                    print(f"    note: {res['memory_plan_note']}", flush=True)
        row = summarise(f"({wid}) {name}", w, budget, runs)
        rows.append(row)
        all_runs[wid] = runs
        print(f"  -> {json.dumps({k: v for k, v in row.items() if k == 'targets' or 'wall' in k}, default=str)}", flush=True)
        _write(args, budget, rows, all_runs)  # after every workload: a later one failing loses nothing
    out = _write(args, budget, rows, all_runs)
    print(markdown(rows))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
