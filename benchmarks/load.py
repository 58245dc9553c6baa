"""Benchmark: a wide exploration of cheap steps, Quiver against plain Dask on the same tasks.

    python benchmarks/load.py              # 500, 1000, 2000 and 4000 branches, 3 repetitions
    python benchmarks/load.py --quick      # smoke test: 500 and 2000 branches, 1 repetition

The exploration: source -> explore "a" (A alternatives) -> explore "b" (40 alternatives)
-> choose("score", k=3) -> a final step on the three kept branches.  Every step takes
microseconds, so the wall time is all overhead: building and compiling the pipeline in the
client, the executor's bookkeeping, and Dask's scheduling of ``1 + A + 40A`` step tasks plus
``40A`` metric tasks, on 2 single-threaded worker processes.

Methods:

(a) Quiver: ``node.run(client)`` (the executor submits everything before the choose at once,
    reads each metric as it arrives, then submits the kept branches' last step).
(b) plain Dask: the *same* compiled tasks (``graph.compile(node).graph`` and its metric
    tasks, identical functions and keys) submitted as one graph with ``client.get``, all
    metric keys requested at once; no chooses, no per-branch bookkeeping.

Reported: build + compile seconds (client only, no cluster) and unique vs naive tasks,
wall seconds of (a) and (b) (medians), per-task overhead (wall / tasks executed), Quiver's
extra cost per task over plain Dask, and the highest number of tasks the scheduler held
during each run (sampled every 50 ms) with the growth of the scheduler process's RSS. The
cluster is started from Dask's own CLI (``dask scheduler``, ``dask worker --nworkers 2
--nthreads 1``), so the scheduler runs in its own process and its memory is measured alone.  Results go to ``benchmarks/results/load.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

B = 40  # alternatives of the inner explore


# ---- cheap steps (this file runs as __main__, so they are shipped by value) ----
def source(seed):
    return seed


def add(x, n):
    return x + n


def score(x, m):
    return {"score": (x * 31 + m * 17) % 1009, "x": x}


def finish(v):
    return {"score": v["score"], "done": True}


def build(a: int):
    from pipelines import Pipeline, grid

    src = Pipeline("load").source(source, seed=0)
    node = src.explore("a", grid(add, n=list(range(a))))
    node = node.explore("b", grid(score, m=list(range(B))))
    return node.choose("score", k=3).then(finish)


def expected_top3(a: int) -> list[int]:
    scores = sorted(((x * 31 + m * 17) % 1009 for x in range(a) for m in range(B)), reverse=True)
    return scores[:3]


def scheduler_probe(client):
    """Sample the scheduler's task count and RSS while a run goes on."""

    def read(dask_scheduler):
        import psutil

        return len(dask_scheduler.tasks), psutil.Process().memory_info().rss

    state = {"peak_tasks": 0, "peak_rss": 0, "stop": threading.Event()}
    base_tasks, base_rss = client.run_on_scheduler(read)
    state["base_rss"] = base_rss

    def loop():
        while not state["stop"].is_set():
            try:
                n, rss = client.run_on_scheduler(read)
            except Exception:
                return
            state["peak_tasks"] = max(state["peak_tasks"], n)
            state["peak_rss"] = max(state["peak_rss"], rss)
            time.sleep(0.05)

    t = threading.Thread(target=loop, daemon=True)
    t.start()

    def stop():
        state["stop"].set()
        t.join(2)
        return state["peak_tasks"], max(0, state["peak_rss"] - base_rss)

    return stop


def run_quiver(client, a: int) -> dict:
    node = build(a)
    stop = scheduler_probe(client)
    t = time.perf_counter()
    result = node.run(client, progress=False, quiet=True)
    wall = time.perf_counter() - t
    peak_tasks, rss = stop()
    got = [v["score"] for v in result.value]
    assert got == expected_top3(a), (got, expected_top3(a))
    s = result.stats
    assert s["executed_tasks"] == s["unique_tasks"] - (len(result.table) - 3)  # finish runs on 3 only
    return {
        "wall_s": wall,
        "tasks": s["executed_tasks"] + s["metric_tasks"],
        "peak_scheduler_tasks": peak_tasks,
        "scheduler_rss_growth_bytes": rss,
    }


def run_dask(client, a: int) -> dict:
    import graph
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    c = graph.compile(build(a))
    finals = set(c.output_keys)
    dsk = {k: t for k, t in c.graph.items() if k not in finals}  # the same work Quiver runs before the choose
    dsk.update(c.metric_graph)
    keys = list(c.metric_graph)
    stop = scheduler_probe(client)
    t = time.perf_counter()
    hlg = HighLevelGraph({"plain": MaterializedLayer(dsk)}, {"plain": set()})
    values = client.get(hlg, keys, sync=True)
    top = sorted((m for m, _ in values), reverse=True)[:3]
    wall = time.perf_counter() - t
    peak_tasks, rss = stop()
    assert [int(x) for x in top] == expected_top3(a)
    return {"wall_s": wall, "tasks": len(dsk), "peak_scheduler_tasks": peak_tasks, "scheduler_rss_growth_bytes": rss}


@contextlib.contextmanager
def cli_cluster():
    """``dask scheduler`` and ``dask worker --nworkers 2 --nthreads 1`` as separate processes (from
    Dask's own CLI), so the scheduler's memory is its own; torn down (process groups) afterwards."""
    import socket
    import subprocess

    from distributed import Client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask_cli = str(Path(sys.executable).with_name("dask"))
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], **quiet)]
    try:
        procs.append(subprocess.Popen([dask_cli, "worker", address, "--nworkers", "2", "--nthreads", "1",
                                       "--no-dashboard", "--host", "127.0.0.1"], **quiet))
        deadline = time.time() + 60
        while True:
            try:
                with Client(address, timeout="5s") as c:
                    c.wait_for_workers(2, timeout=max(1.0, deadline - time.time()))
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)


def compile_figures(a: int) -> dict:
    import graph

    t = time.perf_counter()
    node = build(a)
    built = time.perf_counter() - t
    t = time.perf_counter()
    c = graph.compile(node)
    compiled = time.perf_counter() - t
    return {
        "branches": len(c.branches),
        "build_s": built,
        "compile_s": compiled,
        "unique_tasks": c.unique_tasks,
        "metric_tasks": len(c.metric_graph),
        "naive_tasks": c.naive_tasks,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: 500 and 2000 branches, 1 repetition")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--output", default=str(RESULTS / "load.json"))
    args = ap.parse_args(argv)
    sizes = [500 // B, 2000 // B] if args.quick else [500 // B, 1000 // B, 2000 // B, 4000 // B]
    repeats = args.repeats or (1 if args.quick else 3)

    import dask
    import distributed
    from distributed import Client

    rows = []
    with cli_cluster() as address, Client(address) as client:
        run_quiver(client, 2)  # warm up: imports, pickling caches
        run_dask(client, 2)
        for a in sizes:
            fig = min((compile_figures(a) for _ in range(repeats)), key=lambda f: f["compile_s"])
            q, d = [], []
            for _ in range(repeats):  # interleaved, so load drifts hit both alike
                q.append(run_quiver(client, a))
                d.append(run_dask(client, a))
            qw = statistics.median(r["wall_s"] for r in q)
            dw = statistics.median(r["wall_s"] for r in d)
            row = dict(
                fig,
                quiver_wall_s=qw,
                dask_wall_s=dw,
                quiver_tasks=q[0]["tasks"],
                dask_tasks=d[0]["tasks"],
                quiver_ms_per_task=1000 * qw / q[0]["tasks"],
                dask_ms_per_task=1000 * dw / d[0]["tasks"],
                quiver_peak_scheduler_tasks=max(r["peak_scheduler_tasks"] for r in q),
                dask_peak_scheduler_tasks=max(r["peak_scheduler_tasks"] for r in d),
                quiver_scheduler_rss_growth_mb=max(r["scheduler_rss_growth_bytes"] for r in q) / 2**20,
                dask_scheduler_rss_growth_mb=max(r["scheduler_rss_growth_bytes"] for r in d) / 2**20,
                raw={"quiver": q, "dask": d},
            )
            rows.append(row)

    head = (
        f"{'branches':>8} {'naive':>6} {'unique':>6} {'compile s':>9} {'us/branch':>9} | "
        f"{'Quiver s':>8} {'ms/task':>7} | {'Dask s':>7} {'ms/task':>7} | {'extra ms/task':>13} | "
        f"{'peak sched tasks Q/D':>20} {'sched RSS +MB Q/D':>18}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        extra = r["quiver_ms_per_task"] - r["dask_ms_per_task"]
        print(
            f"{r['branches']:>8} {r['naive_tasks']:>6} {r['unique_tasks'] + r['metric_tasks']:>6} "
            f"{r['build_s'] + r['compile_s']:>9.3f} {1e6 * (r['build_s'] + r['compile_s']) / r['branches']:>9.1f} | "
            f"{r['quiver_wall_s']:>8.2f} {r['quiver_ms_per_task']:>7.2f} | {r['dask_wall_s']:>7.2f} "
            f"{r['dask_ms_per_task']:>7.2f} | {extra:>13.2f} | "
            f"{r['quiver_peak_scheduler_tasks']:>9}/{r['dask_peak_scheduler_tasks']:<10} "
            f"{r['quiver_scheduler_rss_growth_mb']:>8.1f}/{r['dask_scheduler_rss_growth_mb']:<8.1f}"
        )
    print(
        "\nunique counts the step tasks plus one metric task per branch; naive is what every branch "
        "running its own path would build. Both methods run on the same cluster: `dask scheduler` and "
        f"`dask worker --nworkers 2 --nthreads 1` processes; medians of {repeats} run(s)."
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "load",
        "quick": args.quick,
        "repeats": repeats,
        "rows": rows,
        "versions": {"python": platform.python_version(), "dask": dask.__version__, "distributed": distributed.__version__},
        "nproc": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    Path(args.output).write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
