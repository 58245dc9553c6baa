"""DataFrame explorations under a memory budget: pandas here, cudf on GPU hosts (same steps)."""

from __future__ import annotations

import pytest

from pipelines import Pipeline, grid
from tests.frame_steps import center, clip, make_frame, score, square

pytestmark = pytest.mark.slow  # 1200 MiB of DataFrames

ROWS = 200_000


def frame_pipeline(lib: str):
    return (
        Pipeline(f"frames-{lib}")
        .source(make_frame, rows=ROWS, seed=1, lib=lib)
        .explore("clean", grid(clip, limit=[1.0, 2.0, 3.0]), center=center)
        .explore("features", square=square, plain=lambda df: df)
        .explore("model", grid(score, weight=[0.5, 1.0]))
        .choose("score", k=1)
    )


def expected_best(lib: str):
    df = make_frame(rows=ROWS, seed=1, lib=lib)
    best = None
    for cleaned in [clip(df, 1.0), clip(df, 2.0), clip(df, 3.0), center(df)]:
        for feats in (square(cleaned), cleaned):
            for w in (0.5, 1.0):
                s = score(feats, w)["score"]
                best = s if best is None else max(best, s)
    return best


def test_pandas_frames_under_a_budget_measure_sizes_with_sizeof(client):
    r = frame_pipeline("pandas").run(client, memory_budget="6 GiB", progress=False)
    plan = r.memory_plan
    assert plan is not None
    # sizes came from dask.sizeof of the real frames (4 float64 columns x ROWS), not the default
    measured = [d.nbytes for d in plan.decisions.values() if d.source == "measured"]
    assert measured and max(measured) >= 4 * 8 * ROWS
    assert r.value["score"] == pytest.approx(expected_best("pandas"))
    assert r.value["lib"] == "pandas" and r.value["rows"] == ROWS  # what the steps received in the run
    assert r.stats["failed_branches"] == 0
    # predicted vs measured is reported (and explained when far apart)
    assert r.stats["predicted_peak_bytes"] > 0 and r.stats["peak_prediction_ratio"] > 0


@pytest.mark.gpu
def test_cudf_frames_same_steps_on_gpu_with_device_spilling():
    cudf = pytest.importorskip("cudf")
    from distributed import Client

    import gpu

    with gpu.cluster(n_workers=1, memory_budget="16 GiB", device_memory_budget="1 GiB") as cl, Client(cl) as c:
        r = frame_pipeline("cudf").run(c, memory_budget="16 GiB", progress=False)
    assert cudf is not None
    assert r.value["lib"] == "cudf"  # the run's steps received cudf frames on the GPU workers
    measured = [d.nbytes for d in r.memory_plan.decisions.values() if d.source == "measured"]
    assert measured and max(measured) >= 4 * 8 * ROWS  # dask.sizeof knows cudf frames
    assert r.value["score"] == pytest.approx(expected_best("pandas"), rel=1e-6)
    assert set(r.table["lib"]) == {"cudf"}
