"""Benchmark: a wide exploration of cheap steps, Quiver against plain Dask on the same tasks.

    python benchmarks/load.py              # 480, 1000, 2000 and 4000 branches, 3 repetitions
    python benchmarks/load.py --quick      # smoke test: 480 and 2000 branches, 1 repetition
    python benchmarks/load.py --sizes 2000 --repeats 5
    python benchmarks/load.py --trivial 100,1000,10000   # per-branch cost of trivial branches

The exploration: source -> explore "a" (A alternatives) -> explore "b" (40 alternatives)
-> choose("score", k=3) -> a final step on the three kept branches.  Every step takes
microseconds, so the wall time is all overhead: building and compiling the pipeline in the
client, the executor's bookkeeping, and Dask's scheduling of ``1 + A + 40A`` step tasks (each
choose input's task sends its metric itself: graph/tasks/fusedmetric.py, no metric tasks), on 2
single-threaded worker processes.

Methods (same cluster, same run, interleaved pairs with the order alternating, medians):

(a) Quiver: ``node.run(client)`` timed whole, building and compiling the pipeline included
    (the executor submits everything before the choose at once, reads each metric as it
    arrives, then submits the kept branches' last step).
(b) plain Dask at its best: the *same* compiled tasks (``graph.compile(node).graph`` and the
    metric tasks Quiver runs, identical functions and keys), already built, submitted as one
    materialized layer with one ``client.get`` (Dask orders it), every choose input's value (or
    metric task) at once; no chooses, no per-branch bookkeeping.

Reported per size: build + compile seconds (client only); wall seconds and ms per task of (a)
and (b); the ratio of per-task costs (medians, and the median of the pairs' ratios, which
cancels load drifting between pairs); CPU ms per task of the scheduler, the workers and this
client together (``psutil``: the figure other load on a shared machine does not inflate);
the scheduler's heap growth per branch during one more (untimed) run of each, measured with
``tracemalloc`` on the scheduler. Targets (printed as met / NOT met): per-task cost <= 1.1x
plain Dask, scheduler memory per branch <= 1.5x, at every size. The cluster is started from
Dask's own CLI (``dask scheduler``, ``dask worker --nworkers 2 --nthreads 1``), so the
scheduler runs in its own process. Results go to ``benchmarks/results/load.json``.
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


def trivial_step(x, i):
    return {"m": i}


def build_trivial(n: int):
    """``n`` trivial branches: a source, one step per branch returning ``{"m": i}``, a choose."""
    from pipelines import Pipeline, grid

    src = Pipeline("trivial").source(source, seed=0)
    return src.explore("i", grid(trivial_step, i=list(range(n)))).choose("m", k=1)


def run_trivial(client, n: int, pids) -> dict:
    """``node.run`` of ``n`` trivial branches timed whole (building and compiling included)."""
    with Probe(pids) as probe:
        t = time.perf_counter()
        result = build_trivial(n).run(client, progress=False, quiet=True)
        wall = time.perf_counter() - t
    assert result.value == {"m": n - 1}, result.value
    s = result.stats
    return {"wall_s": wall, "execute_wall_s": s["wall_seconds"], "tasks": s["executed_tasks"] + s["metric_tasks"],
            **probe.figures()}


def run_trivial_dask(client, n: int, pids) -> dict:
    """The same compiled tasks (steps and metric reads) in one ``client.get``: Dask's own cost."""
    import graph

    c = graph.compile(build_trivial(n))
    reads, keys = metric_reads(c)
    values, figures = _plain_get(client, {**c.graph, **reads}, keys, pids)
    assert max(metric_of(v, "m") for v in values) == n - 1
    return figures


def metric_reads(c) -> tuple[dict, list]:
    """What plain Dask computes to have every choose metric of ``c``, as Quiver does: the read
    tasks Quiver runs too, and for a read fused into its step's task (graph/tasks/fusedmetric.py) the
    step itself (its task sends the metric; plain Dask takes the small value instead)."""
    reads = {k: t for k, t in c.metric_graph.items() if k not in c.fused}
    return reads, list(reads) + sorted(set(c.fused.values()))


def metric_of(value, name: str) -> float:
    """A metric from what :func:`metric_reads` asked for: a read task's ``(metric, scalars)`` or a step's value
    (a parcel, ``graph.parcels``, opened here)."""
    from graph.parcels import opened

    value = opened(value)
    return value[0] if isinstance(value, tuple) else value[name]


def _plain_get(client, dsk: dict, keys: list, pids) -> tuple[list, dict]:
    """``dsk`` in one ``client.get`` of one materialized layer (Dask orders it itself), every key
    of ``keys`` asked for at once: the values, and the figures of a plain Dask row."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    with Probe(pids) as probe:
        t = time.perf_counter()
        hlg = HighLevelGraph({"plain": MaterializedLayer(dsk)}, {"plain": set()})
        values = client.get(hlg, keys, sync=True)
        wall = time.perf_counter() - t
    return values, {"wall_s": wall, "execute_wall_s": wall, "tasks": len(dsk), **probe.figures()}


def trivial_main(sizes: list[int], repeats: int, output: str) -> int:
    """Per-branch cost of ``n`` trivial branches on a warm 2-worker cluster, against plain Dask
    running the same tasks (interleaved pairs, medians)."""
    from distributed import Client

    rows = []
    load_before = os.getloadavg()
    with cli_cluster() as (address, pids), Client(address) as client:
        run_trivial(client, 10, pids)  # warm up
        run_trivial_dask(client, 10, pids)
        for n in sizes:
            q, d = [], []
            for i in range(repeats):
                pair = [lambda: q.append(run_trivial(client, n, pids)), lambda: d.append(run_trivial_dask(client, n, pids))]
                for f in (pair[::-1] if i % 2 else pair):
                    f()
            row = {
                "branches": n,
                "quiver_tasks": q[0]["tasks"],
                "dask_tasks": d[0]["tasks"],
                "quiver_wall_s": statistics.median(r["wall_s"] for r in q),
                "quiver_execute_wall_s": statistics.median(r["execute_wall_s"] for r in q),
                "dask_wall_s": statistics.median(r["wall_s"] for r in d),
                "quiver_client_cpu_s": statistics.median(r["cpu_split_s"]["client"] for r in q),
                "quiver_cpu_s": statistics.median(r["cpu_s"] for r in q),
                "dask_cpu_s": statistics.median(r["cpu_s"] for r in d),
                "raw": {"quiver": q, "dask": d},
            }
            row["quiver_ms_per_branch"] = 1000 * row["quiver_wall_s"] / n
            rows.append(row)
            print(f"{n:>6} branches: Quiver {row['quiver_wall_s']:.2f} s ({row['quiver_ms_per_branch']:.2f} ms/branch, "
                  f"{row['quiver_tasks']} tasks, client CPU {row['quiver_client_cpu_s']:.2f} s) | plain Dask, "
                  f"same tasks: {row['dask_wall_s']:.2f} s ({row['dask_tasks']} tasks)", flush=True)
    load_after = os.getloadavg()
    print(f"medians of {repeats}; load average before {load_before[0]:.1f}, after {load_after[0]:.1f} on "
          f"{os.cpu_count()} cores (shared machine: wall times are noisy)")
    import dask
    import distributed

    big = [r for r in rows if r["branches"] >= 10000]
    payload = {
        "benchmark": "load --trivial",
        "repeats": repeats,
        "rows": rows,
        "target": "10,000 trivial branches in <= 10 s (<= 1 ms per branch)",
        "met": bool(big) and all(r["quiver_ms_per_branch"] <= 1.0 for r in big),  # judged at 10,000 branches only
        "versions": {"python": platform.python_version(), "dask": dask.__version__, "distributed": distributed.__version__},
        "nproc": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {output}")
    return 0


def build(a: int):
    from pipelines import Pipeline, grid

    src = Pipeline("load").source(source, seed=0)
    node = src.explore("a", grid(add, n=list(range(a))))
    node = node.explore("b", grid(score, m=list(range(B))))
    return node.choose("score", k=3).then(finish)


def expected_top3(a: int) -> list[int]:
    scores = sorted(((x * 31 + m * 17) % 1009 for x in range(a) for m in range(B)), reverse=True)
    return scores[:3]


class Probe:
    """The CPU seconds one run cost, read from outside: this client (all its threads), the
    scheduler process and the worker processes (``psutil``). CPU seconds hold on a machine
    shared with other load, where wall time does not. Nothing runs during the run itself."""

    def __init__(self, cluster_pids):
        import psutil

        self.procs = [psutil.Process(p) for p in cluster_pids]

    def cpu(self) -> dict[str, float]:
        import psutil

        out = {"client": time.process_time(), "scheduler": 0.0, "workers": 0.0}
        for i, proc in enumerate(self.procs):
            for p in [proc] + proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    out["scheduler" if i == 0 else "workers"] += t.user + t.system
        return out

    def __enter__(self):
        self.cpu0 = self.cpu()
        return self

    def __exit__(self, *exc):
        after = self.cpu()
        self.cpu_split = {k: after[k] - self.cpu0[k] for k in after}
        self.cpu_s = sum(self.cpu_split.values())
        return False

    def figures(self) -> dict:
        return {"cpu_s": self.cpu_s, "cpu_split_s": self.cpu_split}


def _trace_start(dask_scheduler):
    import tracemalloc

    tracemalloc.start()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


def _trace_stop(dask_scheduler):
    import tracemalloc

    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, len(dask_scheduler.tasks)


def scheduler_memory(client, run) -> dict:
    """Peak bytes the scheduler's Python heap grew by during ``run()`` (``tracemalloc`` on the
    scheduler: exact, unlike RSS, which the allocator keeps after the first big run). A separate,
    untimed pass: tracing slows the scheduler."""
    import gc

    client.run_on_scheduler(gc.collect)
    base = client.run_on_scheduler(_trace_start)
    try:
        run()
    finally:
        peak, _ = client.run_on_scheduler(_trace_stop)
    return {"scheduler_peak_growth_bytes": max(0, peak - base)}


def run_quiver(client, a: int, pids) -> dict:
    node = build(a)
    with Probe(pids) as probe:
        t = time.perf_counter()
        result = node.run(client, progress=False, quiet=True)
        wall = time.perf_counter() - t
    got = [v["score"] for v in result.value]
    assert got == expected_top3(a), (got, expected_top3(a))
    s = result.stats
    assert s["executed_tasks"] == s["unique_tasks"] - (len(result.table) - 3)  # finish runs on 3 only
    return {
        "wall_s": wall,
        "execute_wall_s": s["wall_seconds"],  # the run without building and compiling the pipeline
        "tasks": s["executed_tasks"] + s["metric_tasks"],
        **probe.figures(),
    }


def run_dask(client, a: int, pids) -> dict:
    """Plain Dask at its best: the same tasks, already built, in one ``client.get`` of one
    materialized layer (Dask orders it itself), every metric key asked for at once."""
    import graph

    c = graph.compile(build(a))
    finals = set(c.output_keys)
    dsk = {k: t for k, t in c.graph.items() if k not in finals}  # the same work Quiver runs before the choose
    reads, keys = metric_reads(c)
    dsk.update(reads)
    values, figures = _plain_get(client, dsk, keys, pids)
    top = sorted((metric_of(v, "score") for v in values), reverse=True)[:3]
    assert [int(x) for x in top] == expected_top3(a)
    return figures


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
        yield address, [p.pid for p in procs]
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
        "metric_tasks": len(c.metric_graph) - len(c.fused),
        "naive_tasks": c.naive_tasks,
    }


TARGET_TIME = 1.1  # Quiver's per-task cost at most 1.1x plain Dask's
TARGET_MEMORY = 1.5  # scheduler memory per branch at most 1.5x plain Dask's


def ratio(xs, ys) -> float:
    return statistics.median(xs) / statistics.median(ys)


def summarize(fig: dict, q: list[dict], d: list[dict], mem: dict) -> dict:
    """One row: medians, per-task costs and the ratios the targets are about.

    Wall time is per task (Quiver runs 3 more tasks: the final step of the kept branches).
    ``pair_ratio`` is the median of the ratios of the interleaved (Quiver, Dask) pairs, which
    cancels load that drifts between pairs; CPU seconds (cluster processes plus this client)
    are the figure a shared machine does not inflate."""
    qt, dt = q[0]["tasks"], d[0]["tasks"]
    per_task = lambda runs, field, n: [r[field] / n for r in runs]  # noqa: E731
    pairs = [(a[f] / qt) / (b[f] / dt) for a, b in zip(q, d) for f in ("wall_s",)]
    row = dict(
        fig,
        quiver_tasks=qt,
        dask_tasks=dt,
        quiver_wall_s=statistics.median(r["wall_s"] for r in q),
        quiver_execute_wall_s=statistics.median(r["execute_wall_s"] for r in q),
        dask_wall_s=statistics.median(r["wall_s"] for r in d),
        quiver_ms_per_task=1000 * statistics.median(per_task(q, "wall_s", qt)),
        dask_ms_per_task=1000 * statistics.median(per_task(d, "wall_s", dt)),
        quiver_cpu_ms_per_task=1000 * statistics.median(per_task(q, "cpu_s", qt)),
        dask_cpu_ms_per_task=1000 * statistics.median(per_task(d, "cpu_s", dt)),
        quiver_scheduler_kb_per_branch=mem["quiver"]["scheduler_peak_growth_bytes"] / 1024 / fig["branches"],
        dask_scheduler_kb_per_branch=mem["dask"]["scheduler_peak_growth_bytes"] / 1024 / fig["branches"],
        raw={"quiver": q, "dask": d, "memory": mem},
    )
    row["wall_ratio"] = row["quiver_ms_per_task"] / row["dask_ms_per_task"]
    row["wall_pair_ratio"] = statistics.median(pairs)
    row["execute_wall_ratio"] = ratio([r["execute_wall_s"] / qt for r in q], [r["wall_s"] / dt for r in d])
    row["cpu_ratio"] = row["quiver_cpu_ms_per_task"] / row["dask_cpu_ms_per_task"]
    row["memory_ratio"] = row["quiver_scheduler_kb_per_branch"] / max(row["dask_scheduler_kb_per_branch"], 1e-9)
    return row


def targets(rows: list[dict]) -> dict:
    """Met / not met, with the measured values behind each verdict."""
    worst_wall = max(rows, key=lambda r: r["wall_pair_ratio"])
    worst_cpu = max(rows, key=lambda r: r["cpu_ratio"])
    worst_mem = max(rows, key=lambda r: r["memory_ratio"])
    return {
        "per_task_wall": {
            "target": f"<= {TARGET_TIME}x plain Dask (median of interleaved pairs), every size",
            "worst": worst_wall["wall_pair_ratio"], "at_branches": worst_wall["branches"],
            "met": worst_wall["wall_pair_ratio"] <= TARGET_TIME,
        },
        "per_task_cpu": {
            "target": f"<= {TARGET_TIME}x plain Dask (CPU seconds of scheduler, workers and client), every size",
            "worst": worst_cpu["cpu_ratio"], "at_branches": worst_cpu["branches"],
            "met": worst_cpu["cpu_ratio"] <= TARGET_TIME,
        },
        "scheduler_memory_per_branch": {
            "target": f"<= {TARGET_MEMORY}x plain Dask (peak growth of the scheduler's heap, tracemalloc), every size",
            "worst": worst_mem["memory_ratio"], "at_branches": worst_mem["branches"],
            "met": worst_mem["memory_ratio"] <= TARGET_MEMORY,
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: 480 and 2000 branches, 1 repetition")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="branch counts (multiples of 40)")
    ap.add_argument("--output", default=None, help="results JSON (default benchmarks/results/load.json, "
                    "or load_trivial.json with --trivial)")
    ap.add_argument("--trivial", default=None, metavar="N,N,...",
                    help="per-branch cost of N trivial branches (a step returning {'m': i} and a choose), e.g. 100,1000,10000")
    args = ap.parse_args(argv)
    if args.trivial:
        try:
            counts = [int(x) for x in args.trivial.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--trivial takes branch counts separated by commas (e.g. 100,1000,10000), not {args.trivial!r}")
        if not counts or min(counts) < 1:
            ap.error("--trivial needs positive branch counts, e.g. 100,1000,10000")
        return trivial_main(counts, args.repeats or 3, args.output or str(RESULTS / "load_trivial.json"))
    args.output = args.output or str(RESULTS / "load.json")
    if args.sizes:
        sizes = [max(1, n // B) for n in args.sizes]
    else:
        sizes = [500 // B, 2000 // B] if args.quick else [500 // B, 1000 // B, 2000 // B, 4000 // B]
    repeats = args.repeats or (1 if args.quick else 3)

    import dask
    import distributed
    from distributed import Client

    rows = []
    load_before = os.getloadavg()
    with cli_cluster() as (address, pids), Client(address) as client:
        run_quiver(client, 2, pids)  # warm up: imports, pickling caches
        run_dask(client, 2, pids)
        for a in sizes:
            fig = min((compile_figures(a) for _ in range(repeats)), key=lambda f: f["compile_s"])
            q, d = [], []
            for i in range(repeats):  # interleaved pairs, the order alternating, so drifting load hits both alike
                if i % 2:
                    d.append(run_dask(client, a, pids))
                    q.append(run_quiver(client, a, pids))
                else:
                    q.append(run_quiver(client, a, pids))
                    d.append(run_dask(client, a, pids))
            mem = {
                "quiver": scheduler_memory(client, lambda: run_quiver(client, a, pids)),
                "dask": scheduler_memory(client, lambda: run_dask(client, a, pids)),
            }
            rows.append(summarize(fig, q, d, mem))
    verdicts = targets(rows)

    head = (
        f"{'branches':>8} {'unique':>6} {'compile s':>9} | {'Quiver s':>8} {'ms/task':>7} {'cpu ms':>6} | "
        f"{'Dask s':>7} {'ms/task':>7} {'cpu ms':>6} | {'wall x':>6} {'pairs x':>7} {'cpu x':>6} | "
        f"{'sched KB/branch Q/D':>19} {'mem x':>5}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['branches']:>8} {r['unique_tasks'] + r['metric_tasks']:>6} {r['build_s'] + r['compile_s']:>9.3f} | "
            f"{r['quiver_wall_s']:>8.2f} {r['quiver_ms_per_task']:>7.3f} {r['quiver_cpu_ms_per_task']:>6.3f} | "
            f"{r['dask_wall_s']:>7.2f} {r['dask_ms_per_task']:>7.3f} {r['dask_cpu_ms_per_task']:>6.3f} | "
            f"{r['wall_ratio']:>6.2f} {r['wall_pair_ratio']:>7.2f} {r['cpu_ratio']:>6.2f} | "
            f"{r['quiver_scheduler_kb_per_branch']:>9.1f}/{r['dask_scheduler_kb_per_branch']:<9.1f} {r['memory_ratio']:>5.2f}"
        )
    load_after = os.getloadavg()
    print(
        "\nunique: step tasks plus metric tasks (none where the step sends its metric). Quiver's time is node.run() whole (building and "
        "compiling included); plain Dask runs the same tasks, already built, in one client.get. Both on the same "
        "cluster (`dask scheduler` + `dask worker --nworkers 2 --nthreads 1`), interleaved, medians of "
        f"{repeats} run(s). cpu ms: CPU of scheduler + workers + client per task. "
        f"Load average before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} cores"
        + (" (a SHARED machine: wall times are skewed by other load; the CPU ratio is the steadier figure)." if max(load_before[0], load_after[0]) > 1.5 else ".")
    )
    for name, t in verdicts.items():
        print(f"target {name}: {t['target']}: worst {t['worst']:.2f}x at {t['at_branches']} branches -> "
              f"{'met' if t['met'] else 'NOT met'}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "load",
        "quick": args.quick,
        "repeats": repeats,
        "rows": rows,
        "targets": verdicts,
        "versions": {"python": platform.python_version(), "dask": dask.__version__, "distributed": distributed.__version__},
        "nproc": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "shared_machine": max(load_before[0], load_after[0]) > 1.5,
    }
    Path(args.output).write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
