"""Steps over Dask collections for tests/test_collections.py: a Parquet table read with
``dd.from_map`` and cleaned with ``map_partitions``; both write one side-effect file per
execution (partition), so a test counts how often each partition really ran."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pandas as pd

from pipelines import lazy

COLUMNS = ("x1", "x2", "x3")


def write_table(path, parts: int = 4, rows: int = 2000, seed: int = 0) -> tuple[str, ...]:
    """A seeded table as ``parts`` Parquet files (10% of x1 missing); returns the file paths."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for i in range(parts):
        df = pd.DataFrame({c: rng.normal(size=rows) for c in COLUMNS})
        df["y"] = 2 * df.x1 - df.x2 + 0.5 * df.x3 + rng.normal(scale=0.1, size=rows)
        df.loc[rng.random(rows) < 0.1, "x1"] = np.nan
        f = os.path.join(str(path), f"part-{i:03d}.parquet")
        df.to_parquet(f)
        files.append(f)
    return tuple(files)


def _mark(log, what: str) -> None:
    if log:
        with open(os.path.join(log, f"{what}-{uuid.uuid4().hex}"), "w"):
            pass


def read_part(file: str, log: str = "", backend: str = "pandas") -> pd.DataFrame:
    _mark(log, "read-" + os.path.basename(file))
    if backend == "cudf":  # GPU hosts: the same table as a cudf frame
        import cudf

        return cudf.read_parquet(file)
    return pd.read_parquet(file)


def clean_part(df: pd.DataFrame, fill, method: str, log: str = "", pause: float = 0.0) -> pd.DataFrame:
    _mark(log, f"clean-{method}")
    if pause:
        import time

        time.sleep(pause)
    if method == "drop":
        return df.dropna()
    if method == "zero":
        return df.fillna(0.0)
    return df.fillna(fill)  # mean: the table's column means


@lazy
def table(files, log="", backend="pandas"):
    import dask.dataframe as dd

    meta = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS + ("y",)})
    if backend == "cudf":
        import cudf

        meta = cudf.from_pandas(meta)
    return dd.from_map(read_part, list(files), log=log, backend=backend, meta=meta)  # meta: no partition read to infer it


def clean(df, method, log="", pause=0.0):
    fill = df.mean() if method == "mean" else 0.0
    return df.map_partitions(clean_part, fill, method=method, log=log, pause=pause, meta=df._meta)


def first_part_means(part: pd.DataFrame) -> pd.Series:
    return part.mean()


def impute_first(df):
    """Fill with the first partition's means, passed to map_partitions as a ``Delayed``."""
    import dask

    means = dask.delayed(first_part_means, pure=True)(df.to_delayed(optimize_graph=False)[0])
    return df.map_partitions(pd.DataFrame.fillna, means, meta=df._meta)


def select(df, cols):
    return df[list(cols) + ["y"]]


def score(df, w):
    """Squared error of a fixed linear predictor ``w`` (one weight per feature column): a
    reduction over partitions, returned as Dask scalars."""
    cols = [c for c in df.columns if c != "y"]
    pred = sum(df[c] * w for c in cols)
    return {"mse": ((pred - df.y) ** 2).mean(), "rows": df.y.count()}


def score_and_keep(df, w):
    """:func:`score`, with the table itself in the value (a partitioned collection in a mapping)."""
    return {**score(df, w), "table": df}


def summary(value):
    """A plain step after a choose: gets the kept value computed (pandas)."""
    return {"mse": value["mse"], "rows": len(value["table"]), "kind": type(value["table"]).__module__.split(".")[0]}


def wrong_column(df):
    return df[["no_such_column"]]


def n_rows(df):
    """A plain step: it computes (len of a collection)."""
    return {"rows": len(df)}
