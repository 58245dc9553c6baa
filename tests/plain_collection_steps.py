"""Steps a user writes first with Dask collections, without marking anything lazy
(tests/test_plain_collections.py). Importable by the workers."""

from __future__ import annotations


def load(path):
    import dask.dataframe as dd

    return dd.read_parquet(path)


def load_pandas(path):
    import pandas as pd

    return pd.read_parquet(path)


def drop_missing(df):
    return df.dropna()


def score(df, scale):
    return {"m": (df["x"] * scale).mean()}


def lazy_score(df, scale):
    """Turns a computed pandas frame back into a Dask collection and returns its lazy mean."""
    import dask.dataframe as dd

    return {"m": (dd.from_pandas(df, npartitions=2)["x"] * scale).mean(), "rows": len(df)}
