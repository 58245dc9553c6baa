"""The collection source a user writes first: ``p.source(load, path=...)`` where ``load`` returns
``dd.read_parquet(path)`` without ``@pipelines.lazy``. It fails at that first value with an
error naming ``pipelines.lazy`` and why, not at the choose with "metric must be a real number";
a plain step whose value turns out to be a Dask collection fails the same way."""

from __future__ import annotations

import pandas as pd
import pytest

from pipelines import Pipeline, RunError, grid, lazy
from tests import plain_collection_steps as steps

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "table"
    path.mkdir()
    pd.DataFrame({"x": [1.0, 2.0, None, 4.0]}).to_parquet(path / "part.0.parquet")
    return str(path)


def test_plain_source_returning_a_dask_dataframe_names_lazy(client, table):
    node = (
        Pipeline("first").source(steps.load, path=table)
        .then(steps.drop_missing)
        .explore("model", grid(steps.score, scale=[1.0, 2.0]))
        .choose("m")
    )
    with pytest.raises(RunError) as info:
        node.run(client, progress=False, quiet=True)
    msg = str(info.value)
    assert "source(load)" in msg and "returned a Dask DataFrame" in msg
    assert "@pipelines.lazy" in msg and "never join the exploration's graph" in msg
    assert "must be a real number" not in msg  # not the choose's confusing error
    t = info.value.table
    assert set(t["failed_step"]) == {"load"}  # the first such value, not a later step
    assert t["error"].str.contains("CollectionValueError").all()


def test_the_fix_it_names_works(client, table):
    node = (
        Pipeline("first").source(lazy(steps.load), path=table)
        .then(steps.drop_missing)
        .explore("model", grid(steps.score, scale=[1.0, 2.0]))
        .choose("m")
    )
    r = node.run(client, progress=False, quiet=True)
    assert float(r.value["m"]) == pytest.approx(2 * 7 / 3)  # mean of 2 * (1, 2, 4): the missing row dropped
    assert list(r.table["chosen"]) == [False, True]


def test_plain_step_returning_a_dask_scalar_names_the_step(client, table):
    node = (
        Pipeline("first").source(steps.load_pandas, path=table)
        .explore("model", grid(steps.lazy_score, scale=[1.0, 2.0]))
        .choose("m")
    )
    with pytest.raises(RunError) as info:
        node.run(client, progress=False, quiet=True)
    msg = str(info.value)
    assert "step lazy_score returned a Dask Scalar in its entry 'm'" in msg
    assert "@pipelines.lazy" in msg and ".compute()" in msg
    assert set(info.value.table["failed_step"]) == {"lazy_score"}
