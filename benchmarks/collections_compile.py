"""Client-side cost of collection steps at scale (docs/architecture.md §8), no cluster: compiling
a 12-branch exploration over a Dask DataFrame of N partitions (3 cleanings x 2 feature sets x 2
models; the files are never read: lazy sources with ``meta=``), the state machine's Start, and
the memory plan. Machine-shared numbers: compare runs on the same machine only.

    PYTHONPATH=. python benchmarks/collections_compile.py [--partitions 100 400] [--out benchmarks/results/collections_compile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time

from pipelines import Pipeline, grid
from tests import collection_steps as cs


def exploration(n: int):
    files = tuple(f"/nonexistent/part-{i:05d}.parquet" for i in range(n))
    src = Pipeline("scale").source(cs.table, files=files)
    cleaned = src.explore("clean", *[grid(cs.clean, method=[m]) for m in ("drop", "zero", "mean")])
    feats = cleaned.explore("features", grid(cs.select, cols=[("x1", "x2"), ("x1", "x2", "x3")]))
    return feats.explore("model", grid(cs.score, w=[0.5, 1.0])).choose("mse", mode="min")


def measure(n: int) -> dict:
    import graph
    from graph.state import ExplorationState, Start

    node = exploration(n)
    t = time.perf_counter()
    c = node.compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    ExplorationState(c).handle(Start())
    start_s = time.perf_counter() - t
    t = time.perf_counter()
    graph.plan_memory(c, "8 GiB", workers=2, baseline=300 * 2**20)
    plan_s = time.perf_counter() - t
    return {"partitions": n, "branches": len(c.branches), "unique_tasks": c.unique_tasks,
            "naive_tasks": c.naive_tasks, "compile_s": compile_s, "state_start_s": start_s, "plan_s": plan_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--out", default="benchmarks/results/collections_compile.json")
    args = ap.parse_args()
    rows = [measure(n) for n in args.partitions]
    print(f"{'partitions':>10} {'branches':>8} {'unique':>8} {'naive':>8} {'compile s':>10} {'Start s':>8} {'plan s':>8}")
    for r in rows:
        print(f"{r['partitions']:>10} {r['branches']:>8} {r['unique_tasks']:>8} {r['naive_tasks']:>8} "
              f"{r['compile_s']:>10.2f} {r['state_start_s']:>8.2f} {r['plan_s']:>8.2f}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "load_average_1min": load, "cpus": os.cpu_count(),
                   "note": "2-core machine shared with other engineers' test runs"}, f, indent=1)
    print(f"load average {load}; wrote {args.out}")


if __name__ == "__main__":
    main()
