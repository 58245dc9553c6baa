"""The big-table example (issue 15) at a tiny size: Quiver's choice and numbers are plain Dask's,
shared partitions run once, and the script prints its report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import examples.big_table_explore as ex

ROOT = Path(__file__).resolve().parents[1]
ALPHAS = (0.1, 1000.0)
KINDS = ("linear", "squares")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: writes and explores a Parquet table


def test_same_numbers_and_choice_as_plain_dask(client, tmp_path):
    import dask

    # 12 partitions: the reduction trees (fan-in 8) have a combine level
    path = ex.write_table(tmp_path / "table", rows=12_000, rows_per_file=1_000)
    r = ex.exploration(path, alphas=ALPHAS, kinds=KINDS).run(client, progress=False, quiet=True)
    ours = {}
    for _, row in r.table.iterrows():
        how = row["cleaning.how"] if row["cleaning"] == "impute" else None
        ours[((row["cleaning"], how), row["features.kind"], float(row["model.alpha"]))] = row["val_mse"]
    configs = ex.branch_configs(ALPHAS, KINDS)
    plain = dict(zip(configs, dask.compute(*[ex.branch_metric(path, c) for c in configs])))
    assert set(ours) == set(plain) and len(ours) == 12
    for c in configs:
        assert ours[c] == pytest.approx(plain[c], rel=1e-12), c
    chosen = r.chosen.iloc[0]
    best = min(configs, key=lambda c: (plain[c], configs.index(c)))  # ties: the branch declared first
    assert (chosen["features.kind"], float(chosen["model.alpha"])) == best[1:]
    assert r.value["val_mse"] == pytest.approx(plain[best], rel=1e-12)
    s = r.stats
    # partitions read once, cleaned once per cleaning, summed once per (cleaning, features):
    # the alphas share every partition task, so one job per branch would run many more
    assert s["executed_tasks"] == s["unique_tasks"] < s["naive_tasks"]


def test_script_prints_table_choice_and_stats(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "big_table_explore.py"), "--rows", "9000",
         "--rows-per-file", "3000",
         "--data", str(tmp_path / "table"), "--alphas", "0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert re.search(r"^chosen: cleaning=\S+ features=(linear|squares|interactions) alpha=\S+: validation MSE", out, re.M)
    m = re.search(r"partition tasks: (\d+) executed, (\d+) unique, (\d+) naive", out)
    assert m and int(m[1]) == int(m[2]) < int(m[3])
    assert re.search(r"peak memory [\d,]+ MiB \(sum of workers\) vs budget 1,280 MiB; spilled [\d,]+ MiB", out)
    assert len(re.findall(r"fit_ridge", out)) == 3 * 3  # one table row per branch
