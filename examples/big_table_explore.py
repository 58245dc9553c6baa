"""Explore cleaning x features x ridge models over a Parquet table bigger than a worker
====================================================================================

::

    python examples/big_table_explore.py             # ~700 MiB table, 2 workers x 640 MiB, budget 1.25 GiB
    python examples/big_table_explore.py --full      # >= 10 GiB table (10x and more of one worker)
    python examples/big_table_explore.py --rows 200000 --budget "1 GiB"   # any size
    python examples/big_table_explore.py --report report/   # also the figures (memory over time)

The example writes its own data first: a seeded synthetic table (not a public data set) of
``x0..x11`` (some missing), a target ``y`` and an ``is_val`` flag (a fixed 20% validation
sample, recorded complete), as one Parquet file per 50,000 rows (5 MiB partitions: a task's temporaries stay small), reused when it already exists.
Every step is a Dask collection step: the data is never gathered onto one machine::

    read_table                         dask.dataframe.read_parquet (a collection source)
    cleaning: drop_missing             drop training rows with a missing value
              impute(how=mean|median)  fill with the mean / median of a sample (the first partition)
    features: make_features(kind=...)  linear | squares (+ x0..x3 squared) | interactions (+ pairs)
    model:    fit_ridge(alpha=...)     ridge regression from per-partition X'X / X'y sums,
                                       reduced over partitions; validation MSE a Dask scalar

3 cleanings x 3 feature sets x 3 alphas = 27 branches, chosen by validation MSE. Each
partition is read once, cleaned once per cleaning, and featurised and summed once per
(cleaning, feature set): the alphas share every partition task (only the small solve
differs), because collection keys are deterministic. One Dask job per branch would
read and clean every partition 27 times.

The imputation statistics come from a sample (the first partition), so cleaning streams
partition by partition: a statistic over the whole table would hold every partition in
memory until it is known.

The gallery runs it small while the site builds (``--rows 60000 --rows-per-file 30000 --alphas
0.1,10000``: a 6 MiB table in 2 partitions, 18 branches), so the table fits in a worker there;
the run and its statistics are those of the full size, on less data. The figures are ``result.plot()``'s: each
branch's validation MSE by cleaning, features and alpha, and the workers' measured memory over
time against the memory plan.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

N_X = 12                    # x0 .. x11
MISSING = ("x1", "x2", "x5", "x7")  # the columns with missing values (training rows only)
ROWS_PER_FILE = 50_000
ALPHAS = (0.1, 100.0, 10_000.0)
KINDS = ("linear", "squares", "interactions")
X_COLUMNS = [f"x{j}" for j in range(N_X)]

__all__ = [
    "write_table", "read_table", "drop_missing", "impute", "make_features", "fit_ridge",
    "exploration", "branch_configs", "branch_metric", "table_bytes",
]


# ---------------------------------------------------------------- data (written by the example)

def _file_frame(seed: int, index: int, rows: int) -> pd.DataFrame:
    """One file's rows: its own generator (seed, file index), so any file can be rewritten alone."""
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal((rows, N_X))
    y = (x @ np.linspace(1.0, -1.0, N_X) + 0.8 * x[:, 0] ** 2 - 0.6 * x[:, 1] * x[:, 2]
         + 0.4 * x[:, 3] ** 2 + rng.standard_normal(rows))
    frame = pd.DataFrame(x, columns=X_COLUMNS)
    frame["y"] = y
    frame["is_val"] = rng.random(rows) < 0.2
    train = ~frame["is_val"].to_numpy()
    # missing at random given x0 (and more where |x3| is large): dropping rows biases the
    # sample, imputing keeps it: the strategies differ
    for j, col in enumerate(MISSING):
        p = 0.03 + 0.10 * (x[:, 0] > 0.5) + 0.05 * (np.abs(x[:, 3]) > 1.5)
        gone = train & (rng.random(rows) < p * (1 + j / 4))
        frame.loc[gone, col] = np.nan
    return frame


def table_bytes(rows: int) -> int:
    """Bytes of ``rows`` rows in memory (float64 columns and a bool)."""
    return rows * (8 * (N_X + 1) + 1)


def write_table(path, rows: int, seed: int = 0, rows_per_file: int = ROWS_PER_FILE) -> Path:
    """Write the seeded table as Parquet files under ``path`` (reused when already written).

    >>> import tempfile; d = write_table(tempfile.mkdtemp() + "/t", rows=1000, rows_per_file=400)
    >>> sorted(p.name for p in d.glob("*.parquet"))
    ['part-00000.parquet', 'part-00001.parquet', 'part-00002.parquet']
    """
    path = Path(path)
    manifest = {"rows": int(rows), "seed": int(seed), "rows_per_file": int(rows_per_file), "version": 1}
    done = path / "_quiver_manifest.json"
    if done.exists() and json.loads(done.read_text()) == manifest:
        return path
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    for i, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        _file_frame(seed, i, n).to_parquet(path / f"part-{i:05d}.parquet", index=False)
    done.write_text(json.dumps(manifest))
    return path


# ---------------------------------------------------------------- steps (all lazy: Dask collections)

def read_table(path: str):
    """The table as a ``dask.dataframe`` (one partition per file)."""
    import dask.dataframe as dd

    return dd.read_parquet(path)


def drop_missing(df):
    """Drop the rows with a missing value (validation rows are complete, so only training rows go)."""
    return df.dropna()


def column_stats(part: pd.DataFrame, how: str) -> pd.Series:
    """The imputation values of one sample partition."""
    if how not in ("mean", "median"):
        raise ValueError(f"impute(how={how!r}): use 'mean' or 'median'")
    return getattr(part[list(MISSING)], how)()


def fill_missing(part: pd.DataFrame, *values: float) -> pd.DataFrame:
    return part.fillna(dict(zip(MISSING, values)))


def impute(df, how: str):
    """Fill missing values with the ``how`` ('mean' or 'median') of the first partition (Dask
    scalars, broadcast to every partition)."""
    column_stats(df._meta, how)  # a bad ``how`` fails here, when the pipeline is compiled
    first = df.partitions[0]
    values = [getattr(first[c], how)() for c in MISSING]
    return df.map_partitions(fill_missing, *values, meta=df._meta)


def feature_columns(kind: str) -> list[str]:
    """
    >>> feature_columns("squares")[-2:]
    ['x2^2', 'x3^2']
    """
    if kind == "linear":
        return list(X_COLUMNS)
    if kind == "squares":
        return X_COLUMNS + [f"x{j}^2" for j in range(4)]
    if kind == "interactions":
        return X_COLUMNS + [f"x{i}*x{j}" for i in range(4) for j in range(i + 1, 4)]
    raise ValueError(f"make_features(kind={kind!r}): use one of {', '.join(KINDS)}")


def feature_frame(part: pd.DataFrame, kind: str) -> pd.DataFrame:
    out = {c: part[c] for c in X_COLUMNS}
    if kind == "squares":
        out.update({f"x{j}^2": part[f"x{j}"] ** 2 for j in range(4)})
    elif kind == "interactions":
        out.update({f"x{i}*x{j}": part[f"x{i}"] * part[f"x{j}"] for i in range(4) for j in range(i + 1, 4)})
    out["y"], out["is_val"] = part["y"], part["is_val"]
    return pd.DataFrame(out, index=part.index)  # columns in feature_columns(kind) order, then y, is_val


def make_features(df, kind: str):
    """Feature set ``kind`` (linear | squares | interactions), partition by partition."""
    feature_columns(kind)
    return df.map_partitions(feature_frame, kind, meta=feature_frame(df._meta, kind))


def _design(part: pd.DataFrame) -> np.ndarray:
    cols = [c for c in part.columns if c not in ("y", "is_val")]
    return np.column_stack([np.ones(len(part)), part[cols].to_numpy(dtype=float)])


def partition_sums(part: pd.DataFrame) -> pd.DataFrame:
    """One row: X'X, X'y, y'y and the row count of the partition's training and validation rows
    (X with an intercept column), flattened."""
    X, y, val = _design(part), part["y"].to_numpy(dtype=float), part["is_val"].to_numpy(dtype=bool)
    row = []
    for rows in (~val, val):
        Xs, ys = X[rows], y[rows]
        row.extend([(Xs.T @ Xs).ravel(), Xs.T @ ys, [ys @ ys, float(len(ys))]])
    return pd.DataFrame([np.concatenate(row)], columns=_sum_names(X.shape[1]))


def _sum_names(p: int) -> list[str]:
    return [f"{split}{i}" for split in ("t", "v") for i in range(p * p + p + 2)]


def ridge_solution(sums: pd.Series, alpha: float, names: list[str]) -> dict:
    """Ridge weights from the reduced sums (intercept not penalised, as scikit-learn's Ridge) and
    the training and validation mean squared errors, computed from the sums alone."""
    p = len(names) + 1
    s = sums.to_numpy(dtype=float)
    n = p * p + p + 2

    def unpack(v):
        return v[: p * p].reshape(p, p), v[p * p: p * p + p], v[-2], v[-1]

    xtx, xty, yty, rows = unpack(s[:n])
    penalty = alpha * np.eye(p)
    penalty[0, 0] = 0.0
    w = np.linalg.solve(xtx + penalty, xty)

    def mse(g, gy, yy, m):
        return float((yy - 2 * w @ gy + w @ g @ w) / m)

    vxtx, vxty, vyty, vrows = unpack(s[n:])
    return {"val_mse": mse(vxtx, vxty, vyty, vrows), "train_mse": mse(xtx, xty, yty, rows),
            "coef": pd.Series(w, index=["intercept"] + names), "train_rows": int(rows)}


def _as_row(sums: pd.Series) -> pd.DataFrame:
    return sums.to_frame().T


def _solved(rows: pd.DataFrame, alpha: float, names: list, field: str):
    return ridge_solution(rows.sum(), alpha, names)[field]


def fit_ridge(feats, alpha: float) -> dict:
    """Ridge regression fitted on partitions: per-partition sums, reduced over partitions (a
    tree of fan-in 8, the same keys for every alpha), then one small solve per alpha. Returns
    Dask scalars: the validation MSE (the metric), the training MSE and the coefficients."""
    names = [c for c in feats.columns if c not in ("y", "is_val")]
    meta = pd.DataFrame(columns=_sum_names(len(names) + 1), dtype=float)
    # fan-in 8: with many partitions, one combine over all of them would need every chunk on
    # one worker at once
    sums = feats.map_partitions(partition_sums, meta=meta).sum(split_every=8)  # shared by the alphas

    def solved(field, kind):
        return sums.reduction(chunk=_as_row, aggregate=_solved, meta=kind,
                              aggregate_kwargs={"alpha": float(alpha), "names": names, "field": field})

    return {"val_mse": solved("val_mse", float), "train_mse": solved("train_mse", float),
            "coef": solved("coef", object)}


# ---------------------------------------------------------------- the exploration

def exploration(path, alphas=ALPHAS, kinds=KINDS):
    """The pipeline: read -> cleaning -> features -> model, best validation MSE kept."""
    from pipelines import Pipeline, grid, lazy

    p = Pipeline("big-table")
    table = p.source(lazy(read_table), path=str(path))  # lazy: a collection source, called at compile time
    clean = table.explore("cleaning", drop_missing, grid(impute, how=["mean", "median"]))
    feats = clean.explore("features", grid(make_features, kind=list(kinds)))
    model = feats.explore("model", grid(fit_ridge, alpha=[float(a) for a in alphas]))
    return model.choose("val_mse", mode="min")


def branch_configs(alphas=ALPHAS, kinds=KINDS) -> list[tuple]:
    """(cleaning, kind, alpha) of every branch, in the exploration's declaration order."""
    cleanings = [("drop_missing", None), ("impute", "mean"), ("impute", "median")]
    return [(c, k, float(a)) for c in cleanings for k in kinds for a in alphas]


def branch_metric(path, config) -> object:
    """One branch as a plain Dask collection pipeline (the same functions): its validation MSE."""
    (cleaning, how), kind, alpha = config
    df = read_table(str(path))
    df = drop_missing(df) if cleaning == "drop_missing" else impute(df, how)
    return fit_ridge(make_features(df, kind), alpha)["val_mse"]


# ---------------------------------------------------------------- main

def parse_size(text: str) -> int:
    from dask.utils import parse_bytes

    return int(parse_bytes(text))


def report(result, *, rows: int, budget: int, data: Path) -> None:
    """Print the table (best first), the chosen branch and the run's partition and memory stats."""
    table = result.table
    shown = table.drop(columns=[c for c in ("traceback", "error", "failed_step") if c in table.columns])
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(shown.sort_values("val_mse").to_string())
    row = result.chosen.iloc[0]
    how = f"({row['cleaning.how']})" if row["cleaning"] == "impute" else ""
    value = result.value  # the kept branch's value: its Dask scalars computed (collections would stay persisted)
    print(f"\nchosen: cleaning={row['cleaning']}{how} features={row['features.kind']} "
          f"alpha={row['model.alpha']:g}: validation MSE {row['val_mse']:.5f}, training MSE {value['train_mse']:.5f}")
    s = result.stats
    files = list(Path(data).glob("*.parquet"))
    print(f"table: {table_bytes(rows) / 2**20:,.0f} MiB in memory "
          f"({sum(f.stat().st_size for f in files) / 2**20:,.0f} MiB of Parquet, {len(files)} partitions)")
    print(f"partition tasks: {s['executed_tasks']} executed, {s['unique_tasks']} unique, "
          f"{s['naive_tasks']} naive (one job per branch would run these)")
    print(f"peak memory {s['peak_memory_bytes'] / 2**20:,.0f} MiB (sum of workers) vs budget "
          f"{budget / 2**20:,.0f} MiB; spilled {s['spilled_bytes'] / 2**20:,.0f} MiB; {s['wall_seconds']:.1f}s")
    predicted = s.get("predicted_peak_bytes")
    print(f"predicted peak {predicted / 2**20:,.0f} MiB" if predicted else "predicted peak: no plan",
          f"; worker pauses {s.get('worker_pauses', 0)} ({s.get('paused_seconds', 0.0):.1f} s); "
          f"second-pass copies {s.get('second_pass_copies', 0)}", sep="")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Explore cleaning x features x ridge models over a Parquet table")
    ap.add_argument("--rows", type=int, default=None,
                    help="table rows (default: 7,000,000 = ~700 MiB; --full: 110,000,000 = ~10.8 GiB)")
    ap.add_argument("--full", action="store_true", help="a table of >= 10 GiB (10x and more of one worker)")
    ap.add_argument("--data", default=None, help="directory for the Parquet table (default: a temp-dir cache)")
    ap.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE, help="rows per Parquet file (= partition)")
    ap.add_argument("--workers", type=int, default=2)
    # 640 MiB workers by default: an idle worker with pandas, pyarrow and dask.dataframe imported
    # measured 330-370 MiB, against the 358 MiB results share of a 512 MiB worker (a fresh CI
    # machine refused 2 x 512 MiB as "no room for results"); the default table still exceeds one
    ap.add_argument("--budget", default="1.25 GiB", help="memory budget, the total for all workers")
    ap.add_argument("--alphas", default=",".join(str(a) for a in ALPHAS))
    ap.add_argument("--report", metavar="DIR", help="also write result.plot()'s figures and report.html to DIR")
    args = ap.parse_args(argv)

    import tempfile

    rows = args.rows or (110_000_000 if args.full else 7_000_000)
    budget = parse_size(args.budget)
    if rows < 1 or args.rows_per_file < 1 or args.workers < 1:
        ap.error("--rows, --rows-per-file and --workers must be >= 1")
    data = Path(args.data) if args.data else Path(tempfile.gettempdir()) / f"quiver-big-table-{rows}-{args.rows_per_file}"
    per_worker = budget // args.workers
    print(f"writing {rows:,} rows ({table_bytes(rows) / 2**20:,.0f} MiB in memory, "
          f"{table_bytes(rows) / per_worker:.1f}x one worker's {per_worker / 2**20:.0f} MiB) to {data} ...", flush=True)
    write_table(data, rows, rows_per_file=args.rows_per_file)
    alphas = [float(a) for a in args.alphas.split(",")]

    best = exploration(data, alphas=alphas)
    with best.run(workers=args.workers, memory_budget=budget, progress=False) as result:
        report(result, rows=rows, budget=budget, data=data)
        if args.report:
            written = result.plot(args.report)
            print("report:", ", ".join(sorted(p.name for k, p in written.items() if k != "notes")))


# %%
# Run it: write the table, run the 27 (here 18) branches under the memory budget, print every
# branch best first, the chosen one and the partition-task and memory statistics.

if __name__ == "__main__":
    main()  # not sys.exit(main()): the documentation gallery runs this file inside sphinx-build
