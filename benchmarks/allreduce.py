"""Benchmark: Quiver's worker-to-worker all-reduce vs ``torch.distributed`` gloo, same 2 workers.

    python benchmarks/allreduce.py                      # full run (~1-2 minutes on 2 cores)
    python benchmarks/allreduce.py --quick              # smoke test: 1 KB .. 1 MB, 3 repeats (< 60 s)
    python benchmarks/allreduce.py --max-bytes 4194304  # stop at 4 MB
    python benchmarks/allreduce.py --protocols tcp --algorithms ring

What is compared, per protocol (``tcp``, and ``ucxx`` when ``distributed_ucxx`` imports;
otherwise that protocol is recorded as skipped, with the reason), on a
``LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol=...)``:

* ``torch.distributed`` gloo ``all_reduce`` (sum) *inside those same 2 worker processes*:
  each gang member calls ``init_process_group("gloo", init_method="tcp://127.0.0.1:<free
  port picked by the client>")`` and ``destroy_process_group()`` at the end. gloo always
  uses its own TCP sockets, whatever the Dask protocol.
* Quiver's ``ctx.collective.allreduce_`` in the same processes, for each algorithm
  (``run_gang(..., algorithm="ring"|"tree")``).

One gang (:func:`gpu.gang.run_gang`, one task per worker) per (protocol, algorithm). Inside
it the two methods are timed *alternately*, call by call (the order flips every round),
so a busy machine (2 shared cores) slows both alike and each ratio compares calls made
seconds apart in the same processes. Per size: W warm-up rounds, then R timed rounds;
before each call the tensor (float32, CPU, 1 KB .. 64 MB) is refilled with ones and the
ranks synchronise with that method's own barrier (``dist.barrier()`` /
``ctx.collective.barrier()``); only the all-reduce is timed (``time.perf_counter`` on each
rank). A call's time is the slower rank's (the collective is done when the last rank has
the result); latency = median over the R calls; algorithm bandwidth = bytes / latency.
Every result is checked (every element == 2). ``ratio`` = Quiver latency / gloo latency
of the same gang (lower is better); the issue's goal is ratio <= 1.2 at every size >= 1 MB.

Results (raw per-rank timings, versions, nproc, load average, the exact command) go to
``benchmarks/results/allreduce.json``. The exit status is 1 if a gang failed (after
``--retries``) or a result was wrong.
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread in this process too (the Dask nanny does the same for its workers).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import logging
import platform
import shlex
import socket
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = HERE / "results"
KB, MB = 1 << 10, 1 << 20
FULL_SIZES = [1 * KB, 16 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB]
QUICK_SIZES = [1 * KB, 16 * KB, 256 * KB, 1 * MB]
GOAL_RATIO = 1.2
GOAL_MIN_BYTES = 1 * MB
GANG_TIMEOUT = 120.0  # seconds, bounds every collective wait (64 MB over a slow transport)


def full_repeats(nbytes: int, base: int) -> int:
    """Fewer timed repeats for the biggest sizes (keeps the full run to a few minutes)."""
    if nbytes <= 1 * MB:
        return base
    if nbytes <= 4 * MB:
        return max(3, base // 2)
    if nbytes <= 16 * MB:
        return max(3, base // 3)
    return max(3, base // 4)


# ---- member function (runs inside the 2 Dask worker processes, one gang member each) ----------
def bench_member(ctx, sizes, repeats, warmup, port):
    """Interleaved timing of gloo and Quiver all-reduces in this worker process.

    Per size, W + R rounds; each round times one gloo call and one Quiver call (the order
    alternates between rounds). Before each call the tensor is refilled with ones and the
    ranks synchronise with that method's own barrier; only the all-reduce is timed.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gpu.allreduce import CollectiveError

    coll = ctx.collective
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # everything is on 127.0.0.1
    coll.barrier()  # both members are in; rank 0 is about to host the gloo store
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                            world_size=ctx.size, timeout=timedelta(seconds=GANG_TIMEOUT))
    methods = {"gloo": (dist.barrier, dist.all_reduce), "quiver": (coll.barrier, coll.allreduce_)}
    out = {"times": {m: {} for m in methods}, "correct": {m: {} for m in methods}}
    try:
        for nbytes in sizes:
            key = str(nbytes)
            t = torch.empty(nbytes // 4, dtype=torch.float32)
            times = {m: [] for m in methods}
            correct = {m: True for m in methods}
            for i in range(warmup + repeats[key]):
                for m in (("gloo", "quiver") if i % 2 == 0 else ("quiver", "gloo")):
                    sync, op = methods[m]
                    t.fill_(1.0)
                    sync()
                    start = time.perf_counter()
                    op(t)
                    elapsed = time.perf_counter() - start
                    if i >= warmup:
                        times[m].append(elapsed)
                    correct[m] = correct[m] and bool(torch.all(t == float(ctx.size)).item())
            for m in methods:
                out["times"][m][key] = times[m]
                out["correct"][m][key] = correct[m]
            del t
        out["gloo_backend"] = dist.get_backend()
    finally:
        dist.destroy_process_group()
    # Teardown guard (untimed): over ucxx a member that returns and closes its comms can
    # make the peer lose the last message it has not read yet ("Connection closed by
    # writer" in the peer's *last* collective; see the report). A trailing barrier means
    # no rank closes before every rank has finished the timed calls; the barrier's own
    # message may still be lost that way, which is recorded and not treated as a failure.
    try:
        coll.barrier()
        out["trailing_barrier"] = "ok"
    except CollectiveError as e:
        out["trailing_barrier"] = f"lost at teardown: {e}"
    out.update(rank=ctx.rank, worker=ctx.worker, pid=os.getpid(),
               torch_threads=torch.get_num_threads(), algorithm=coll.algorithm,
               quiver_stats=coll.stats(), GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME"))
    return out


# ---- client side -------------------------------------------------------------------------------
def _worker_env():
    return {k: v for k, v in os.environ.items()
            if k.startswith(("UCX_", "UCXPY_", "GLOO_")) or k.endswith("_NUM_THREADS")}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarise(members, sizes, method):
    """Per size: per-call time = the slower rank's; median, min, max, bandwidth; correctness."""
    per_size = {}
    for nbytes in sizes:
        key = str(nbytes)
        raw = [m["times"][method][key] for m in sorted(members, key=lambda m: m["rank"])]
        per_call = [max(ts) for ts in zip(*raw)]
        med = statistics.median(per_call)
        per_size[key] = {
            "nbytes": nbytes,
            "repeats": len(per_call),
            "raw_seconds_by_rank": raw,
            "per_call_seconds": per_call,
            "median_s": med,
            "min_s": min(per_call),
            "max_s": max(per_call),
            "algbw_bytes_per_s": nbytes / med if med > 0 else None,
            "correct": all(m["correct"][method][key] for m in members),
        }
    return per_size


def run_algorithm(client, algorithm, sizes, repeats, warmup):
    """One gang (Quiver ``algorithm`` interleaved with gloo); a run record, ok or failed."""
    from gpu.gang import run_gang

    record = {"algorithm": algorithm, "status": "ok", "error": None, "port": free_port()}
    start = time.perf_counter()
    try:
        members = run_gang(client, bench_member, None, sizes, repeats, warmup, record["port"],
                           timeout=GANG_TIMEOUT, algorithm=algorithm)
    except Exception as e:
        record.update(status="failed", error=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc(), wall_s=time.perf_counter() - start)
        return record
    record["wall_s"] = time.perf_counter() - start
    record["members"] = [{k: v for k, v in m.items() if k not in ("times", "correct")}
                         for m in members]
    record["quiver"] = summarise(members, sizes, "quiver")
    record["gloo"] = summarise(members, sizes, "gloo")
    return record


def protocol_available(protocol):
    if protocol == "tcp":
        return True, None
    if protocol == "ucxx":
        try:
            import distributed_ucxx  # noqa: F401
        except Exception as e:
            return False, f"import distributed_ucxx failed: {type(e).__name__}: {e}"
        return True, None
    return False, f"unknown protocol {protocol!r}"


def run_protocol(protocol, algorithms, sizes, repeats, warmup, log_level, retries):
    from distributed import Client, LocalCluster

    out = {"protocol": protocol, "status": "ok", "error": None, "runs": []}
    start = time.perf_counter()
    try:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               protocol=protocol, host="127.0.0.1", dashboard_address=None,
                               silence_logs=log_level)
    except Exception as e:
        out.update(status="failed", error=f"LocalCluster(protocol={protocol!r}) failed: "
                                          f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
        return out
    try:
        with cluster, Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            out["cluster_start_s"] = time.perf_counter() - start
            out["workers"] = sorted(client.scheduler_info(n_workers=-1)["workers"])
            out["worker_env"] = client.run(_worker_env)
            for algorithm in algorithms:
                print(f"  [{protocol}] quiver {algorithm} + gloo (interleaved) ...", end="", flush=True)
                attempts = []
                for _ in range(1 + retries):
                    rec = run_algorithm(client, algorithm, sizes, repeats, warmup)
                    attempts.append(rec)
                    if rec["status"] == "ok":
                        break
                    print(f" FAILED ({rec['error'][:200]})", end="", flush=True)
                rec = dict(attempts[-1])
                rec["attempts"] = len(attempts)
                rec["failed_attempts"] = [{k: a.get(k) for k in ("error", "traceback", "wall_s")}
                                          for a in attempts if a["status"] != "ok"]
                out["runs"].append(rec)
                print(f" {rec['status']} ({rec['wall_s']:.1f} s)", flush=True)
    except Exception as e:
        out.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    out["wall_s"] = time.perf_counter() - start
    return out


def versions():
    import dask
    import distributed
    import numpy
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "numpy": numpy.__version__, "dask": dask.__version__,
           "distributed": distributed.__version__}
    try:
        from importlib.metadata import version

        for dist_name, key in (("distributed-ucxx-cu12", "distributed-ucxx"), ("ucxx-cu12", "ucxx"),
                               ("libucx-cu12", "libucx")):
            try:
                out[key] = version(dist_name)
            except Exception:
                pass
    except Exception:
        pass
    try:
        import ucxx

        out["ucxx_module"] = getattr(ucxx, "__version__", "?")
        try:
            out["ucx_library"] = ".".join(map(str, ucxx.get_ucx_version()))
        except Exception:
            pass
    except Exception as e:
        out["ucxx_module"] = f"not importable: {type(e).__name__}: {e}"
    try:
        out["gloo_available"] = bool(torch.distributed.is_available() and
                                     torch.distributed.is_gloo_available())
    except Exception:
        out["gloo_available"] = False
    return out


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except Exception:
        pass
    return platform.processor() or None


def source_fingerprint():
    """sha256 and mtime of the modules under test (they may be edited while this runs)."""
    import hashlib

    out = {}
    for rel in ("gpu/allreduce.py", "gpu/gang.py"):
        path = ROOT / rel
        try:
            out[rel] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                        "mtime_utc": datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
                        .isoformat(timespec="seconds")}
        except OSError as e:
            out[rel] = {"error": str(e)}
    return out


def human(nbytes):
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def compare(protocols, sizes):
    """Quiver / gloo (paired: same gang, interleaved) per protocol, algorithm and size."""
    rows = []
    for proto in protocols:
        for run in proto.get("runs", []):
            for nbytes in sizes:
                key = str(nbytes)
                ok = run["status"] == "ok"
                q = run["quiver"][key]["median_s"] if ok else None
                g = run["gloo"][key]["median_s"] if ok else None
                ratio = q / g if ok and g > 0 else None
                applies = nbytes >= GOAL_MIN_BYTES
                rows.append({
                    "protocol": proto["protocol"], "algorithm": run["algorithm"], "nbytes": nbytes,
                    "quiver_s": q, "gloo_s": g, "ratio": ratio, "goal_applies": applies,
                    "goal_met": (ratio <= GOAL_RATIO) if (applies and ratio is not None) else None,
                })
    return rows


def print_tables(protocols, sizes, comparison):
    cmp = {(r["protocol"], r["algorithm"], r["nbytes"]): r for r in comparison}
    for proto in protocols:
        name = proto["protocol"]
        if proto["status"] == "skipped":
            print(f"\n[{name}] skipped: {proto['error']}")
            continue
        if proto["status"] == "failed" and not proto.get("runs"):
            print(f"\n[{name}] FAILED: {proto['error']}")
            continue
        runs = proto["runs"]
        print(f"\n[{name}] 2 workers x 1 thread. Per Quiver algorithm, one gang timing gloo and "
              f"Quiver calls alternately;\n  median latency (ms), algorithm bandwidth (MB/s = bytes / "
              f"latency), ratio = Quiver / gloo time, goal: ratio <= {GOAL_RATIO} at >= 1 MB")
        head = f"{'size':>6}"
        for r in runs:
            a = r["algorithm"]
            head += (f" | {'gloo ms':>8} {'MB/s':>6} {a + ' ms':>8} {'MB/s':>6} "
                     f"{'ratio':>5} {'goal':>6}")
        print(head)
        print("-" * len(head))
        for nbytes in sizes:
            key = str(nbytes)
            line = f"{human(nbytes):>6}"
            for r in runs:
                if r["status"] != "ok":
                    line += f" | {'failed':>8} {'':>6} {'':>8} {'':>6} {'':>5} {'':>6}"
                    continue
                g, q = r["gloo"][key], r["quiver"][key]
                c = cmp[(name, r["algorithm"], nbytes)]
                goal = "-" if not c["goal_applies"] else ("met" if c["goal_met"] else "MISSED")
                line += (f" | {g['median_s'] * 1e3:8.3f} {g['algbw_bytes_per_s'] / 1e6:6.0f}"
                         f" {q['median_s'] * 1e3:8.3f} {q['algbw_bytes_per_s'] / 1e6:6.0f}"
                         f" {c['ratio']:5.2f} {goal:>6}")
            print(line)
        for r in runs:
            if r["status"] != "ok":
                print(f"  {r['algorithm']} FAILED after {r['attempts']} attempt(s): {r['error'][:300]}")
                continue
            bad = [(m, k) for m in ("gloo", "quiver") for k, v in r[m].items() if not v["correct"]]
            if bad:
                print(f"  {r['algorithm']}: WRONG RESULTS {bad}")
            lost = [m["rank"] for m in r["members"] if m.get("trailing_barrier", "ok") != "ok"]
            if lost:
                print(f"  {r['algorithm']}: untimed trailing barrier lost at teardown on rank(s) {lost}")
            if r.get("failed_attempts"):
                print(f"  {r['algorithm']}: {len(r['failed_attempts'])} failed attempt(s) before "
                      f"success: {r['failed_attempts'][0]['error'][:300]}")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: sizes 1 KB .. 1 MB, 3 repeats, 1 warm-up (< 60 s)")
    ap.add_argument("--max-bytes", type=int, default=None,
                    help="largest tensor size in bytes (sizes above it are dropped)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed calls per size <= 1 MB (default 40; full mode uses fewer for "
                         "bigger sizes: 1/2 at 4 MB, 1/3 at 16 MB, 1/4 at 64 MB; --quick: 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls per size (2; --quick: 1)")
    ap.add_argument("--protocols", default="tcp,ucxx", help="comma list of tcp, ucxx")
    ap.add_argument("--algorithms", default="ring,tree", help="comma list of Quiver's ring, tree")
    ap.add_argument("--retries", type=int, default=1,
                    help="re-run a failed gang this many times (every failure is recorded)")
    ap.add_argument("--verbose", action="store_true", help="show the cluster's warnings")
    ap.add_argument("--output", default=str(RESULTS / "allreduce.json"))
    args = ap.parse_args(argv)

    sizes = list(QUICK_SIZES if args.quick else FULL_SIZES)
    if args.max_bytes is not None:
        sizes = [s for s in sizes if s <= args.max_bytes]
        if not sizes:
            ap.error(f"--max-bytes {args.max_bytes} is below the smallest size ({min(FULL_SIZES)})")
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if args.quick:
        repeats = {str(s): args.repeats or 3 for s in sizes}
    else:
        repeats = {str(s): full_repeats(s, args.repeats or 40) for s in sizes}
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    log_level = logging.WARNING if args.verbose else logging.CRITICAL
    command = shlex.join(["python", "benchmarks/allreduce.py", *argv])

    print(f"all-reduce benchmark: {command}")
    print(f"  sizes {[human(s) for s in sizes]}, repeats {list(repeats.values())}, warm-up {warmup}, "
          f"algorithms {algorithms}, protocols {protocols}, nproc {os.cpu_count()}")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    sources_before = source_fingerprint()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(f"  WARNING: load average {load_before[0]:.2f} on {os.cpu_count()} CPUs before the run: "
              "other processes compete for the cores and the timings will be noisy")
    t0 = time.perf_counter()
    results = []
    for proto in protocols:
        ok, why = protocol_available(proto)
        if not ok:
            print(f"  [{proto}] skipped: {why}")
            results.append({"protocol": proto, "status": "skipped", "error": why, "runs": []})
            continue
        results.append(run_protocol(proto, algorithms, sizes, repeats, warmup, log_level, args.retries))
        if results[-1]["status"] == "failed":
            print(f"  [{proto}] FAILED: {results[-1]['error']}")
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    sources_after = source_fingerprint()
    if sources_after != sources_before:
        print("  WARNING: gpu/allreduce.py or gpu/gang.py changed during the run: the workers may "
              "have run different versions")
    comparison = compare(results, sizes)
    print_tables(results, sizes, comparison)

    goal_rows = [r for r in comparison if r["goal_applies"]]
    print(f"\ngoal (Quiver <= {GOAL_RATIO}x gloo time at every size >= 1 MB):")
    if not goal_rows:
        print("  not evaluated (no size >= 1 MB measured)")
    for r in goal_rows:
        verdict = ("not measured" if r["goal_met"] is None else
                   f"{'met' if r['goal_met'] else 'MISSED'} (ratio {r['ratio']:.3f})")
        print(f"  {r['protocol']:>5} {r['algorithm']:>5} {human(r['nbytes']):>6}: {verdict}")
    print(f"\nwall time {wall:.1f} s; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}")

    env_vars = {k: v for k, v in os.environ.items()
                if k.startswith(("UCX_", "UCXPY_", "DASK_", "GLOO_")) or k.endswith("_NUM_THREADS")}
    payload = {
        "benchmark": "allreduce",
        "command": command,
        "python_executable": sys.executable,
        "cwd": os.getcwd(),
        "mode": "quick" if args.quick else "full",
        "started_utc": started,
        "wall_seconds": wall,
        "environment": {"nproc": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                        "env": env_vars, "versions": versions(),
                        "loadavg_before": load_before, "loadavg_after": load_after,
                        "sources_before": sources_before, "sources_after": sources_after},
        "settings": {
            "sizes_bytes": sizes, "dtype": "float32", "device": "cpu", "repeats_by_size": repeats,
            "warmup": warmup, "algorithms": algorithms, "protocols": protocols,
            "cluster": "LocalCluster(n_workers=2, threads_per_worker=1, processes=True, "
                       "host='127.0.0.1', protocol=<protocol>)",
            "gang_timeout_s": GANG_TIMEOUT, "retries": args.retries,
            "timing": "one gang per (protocol, Quiver algorithm); inside it gloo and Quiver calls "
                      "alternate (order flips every round); per call: tensor.fill_(1); that method's "
                      "barrier (dist.barrier / ctx.collective.barrier); perf_counter around one "
                      "all-reduce on each rank; a call's time = max over ranks; latency = median over "
                      "calls; algbw = bytes / latency; ratio = quiver median / gloo median of the same "
                      "gang",
            "teardown_guard": "an untimed trailing ctx.collective.barrier() in each member "
                              "(works around a ucxx close race, see trailing_barrier per member)",
            "goal": f"quiver_s / gloo_s <= {GOAL_RATIO} at every size >= {GOAL_MIN_BYTES} bytes",
        },
        "protocols": results,
        "comparison": comparison,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"results: {out}")
    failed = [p["protocol"] for p in results if p["status"] == "failed"] + [
        f"{p['protocol']}/{r['algorithm']}" for p in results for r in p.get("runs", [])
        if r["status"] != "ok"]
    wrong = [f"{p['protocol']}/{r['algorithm']}/{m}/{k}" for p in results for r in p.get("runs", [])
             if r["status"] == "ok" for m in ("gloo", "quiver") for k, v in r[m].items()
             if not v["correct"]]
    return 1 if (failed or wrong) else 0

if __name__ == "__main__":
    sys.exit(main())
