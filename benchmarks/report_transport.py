"""Benchmark: how an iterative step's reports reach the run, and how the run's answers reach it.

    python benchmarks/report_transport.py            # 400 reports per transport, 12 gated tasks
    python benchmarks/report_transport.py --quick    # smoke test

On a LocalCluster of 2 single-threaded worker processes (the same as the tests), with
Dask's own machinery only:

Reports, worker -> client (one task sends ``--reports`` reports, ``--gap`` s apart):
  (a) ``Worker.log_event`` on a topic + ``Client.subscribe_topic`` (what ``graph.tasks.iterative``
      uses): the message rides the worker's batched stream; the scheduler forwards it;
  (b) ``distributed.Queue``: ``put`` in the task (a scheduler round trip), a client thread
      blocked in ``get``.
  Measured: the time the step spends sending one report (its overhead per iteration) and the
  latency from send to the client's handler (both processes on one host: one clock).

Answers at a rung, run -> waiting step (the round trip a step waits at each rung: report
sent, client decides at once, step resumes), measured in the step:
  (c) ``graph.tasks.iterative`` as shipped: ``Iterative`` + ``ReportChannel``; the client sets a
      ``Variable`` then an ``Event``; the step waits on the ``Event`` and reads the ``Variable``;
  (d) reports by event log, answer in a ``Variable`` the step polls with ``get(timeout=1)``
      (one RPC less, but every timed-out poll logs an error on the scheduler);
  (e) ``Queue`` both ways (reports on one queue, answers on a queue per rung); not
      replay-safe: a restarted step would find the answer already consumed.

Stopping a step between rungs, two ways measured in the step:
  (f) polling a per-key ``distributed.Event.is_set`` every iteration (a scheduler round trip);
  (g) ``graph.tasks.iterative``'s check that the run has not cancelled the task (the worker's own
      task state: no message at all); plus the time from ``Future.cancel()`` to the generator's
      ``finally``.

Results go to ``benchmarks/results/report_transport.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graph.tasks.iterative import Iterative, ReportChannel  # noqa: E402
from graph.parcels import opened  # noqa: E402  (a step's value travels as a parcel)
from graph.spec import PruneSpec  # noqa: E402

TOPIC = "bench-report"


def stats_ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {
        "n": len(xs),
        "median_ms": round(statistics.median(xs) * 1e3, 3),
        "p90_ms": round(pick(0.9) * 1e3, 3),
        "mean_ms": round(statistics.fmean(xs) * 1e3, 3),
    }


# ---- worker side -------------------------------------------------------------------------------
def send_log_event(n: int, gap: float) -> list[float]:
    from distributed import get_worker

    w, cost = get_worker(), []
    for i in range(n):
        t = time.time()
        w.log_event(TOPIC, {"i": i, "t": t, "report": {"accuracy": 0.5, "loss": 1.0}})
        cost.append(time.time() - t)
        time.sleep(gap)
    return cost


def send_queue(n: int, gap: float, name: str) -> list[float]:
    from distributed import Queue, get_client

    q, cost = Queue(name, client=get_client()), []
    for i in range(n):
        t = time.time()
        q.put({"i": i, "t": t, "report": {"accuracy": 0.5, "loss": 1.0}})
        cost.append(time.time() - t)
        time.sleep(gap)
    q.put(None)
    return cost


def gated(n: int):
    """Yields n reports; the wrapper's time between a yield and the next resume is measured here."""
    waits = []
    t = time.time()
    for i in range(1, n + 1):
        yield {"accuracy": i / n}
        waits.append((i, time.time() - t))
        t = time.time()
    return {"waits": waits}


def gated_variable(n: int, key: str) -> list:
    from distributed import Variable, get_client, get_worker

    w, c, out = get_worker(), get_client(), []
    prune = PruneSpec(2, 1)
    for i in range(1, n + 1):
        t = time.time()
        w.log_event(TOPIC, {"key": key, "i": i})
        if prune.rung_of(i) is not None:
            var = Variable(f"bench-{key}-{i}", client=c)
            while True:
                try:
                    var.get(timeout=1)
                    break
                except TimeoutError:
                    pass
        out.append((i, time.time() - t))
    return out


def gated_queue(n: int, key: str) -> list:
    from distributed import Queue, get_client

    c, out = get_client(), []
    reports = Queue("bench-reports", client=c)
    prune = PruneSpec(2, 1)
    for i in range(1, n + 1):
        t = time.time()
        reports.put({"key": key, "i": i})
        if prune.rung_of(i) is not None:
            Queue(f"bench-{key}-{i}", client=c).get()
        out.append((i, time.time() - t))
    return out


def poll_event(n: int, name: str) -> list[float]:
    from distributed import Event, get_client

    ev, cost = Event(name, client=get_client()), []
    for _ in range(n):
        t = time.time()
        ev.is_set()
        cost.append(time.time() - t)
    return cost


def local_check(n: int) -> list[float]:
    from graph.tasks.iterative import _Task

    task, cost = _Task(), []
    for _ in range(n):
        t = time.time()
        task.cancelled()
        cost.append(time.time() - t)
    return cost


def endless(path: str):
    try:
        while True:
            yield {"x": 1.0}
            time.sleep(0.002)
    finally:
        Path(path).write_text(repr(time.time()))


# ---- client side ------------------------------------------------------------------------------------
def measure_reports(client, n: int, gap: float) -> dict:
    got: list[float] = []
    done = threading.Event()

    def handler(event):
        _, msg = event
        got.append(time.time() - msg["t"])
        if len(got) == n:
            done.set()

    client.subscribe_topic(TOPIC, handler)
    cost = client.submit(send_log_event, n, gap, pure=False).result()
    done.wait(60)
    client.unsubscribe_topic(TOPIC)
    out = {"log_event": {"send": stats_ms(cost), "latency": stats_ms(got)}}

    from distributed import Queue

    name = f"bench-q-{time.time_ns()}"
    q, lat = Queue(name, client=client), []

    def reader():
        while True:
            msg = q.get()
            if msg is None:
                return
            lat.append(time.time() - msg["t"])

    th = threading.Thread(target=reader)
    th.start()
    cost = client.submit(send_queue, n, gap, name, pure=False).result()
    th.join(60)
    out["queue"] = {"send": stats_ms(cost), "latency": stats_ms(lat)}
    return out


def split(waits: list, prune: PruneSpec) -> tuple[list, list]:
    rung = [t for i, t in waits if prune.rung_of(i) is not None]
    other = [t for i, t in waits if prune.rung_of(i) is None]
    return rung, other


def measure_gates(client, tasks: int, iters: int) -> dict:
    prune = PruneSpec(2, 1)
    out = {}
    # (c) the shipped machinery
    answers: queue.Queue = queue.Queue()
    channel = ReportChannel(client, lambda key, i, report: answers.put((key, i)))
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            try:
                key, i = answers.get(timeout=0.1)
            except queue.Empty:
                continue
            if prune.rung_of(i) is not None:
                channel.resume(key, i)

    th = threading.Thread(target=answer)
    th.start()
    rung, other = [], []
    for t in range(tasks):
        res = opened(client.submit(Iterative(gated, prune), iters, key=f"gated-{t}-{time.time_ns()}", pure=False).result())
        r, o = split(res["waits"], prune)
        rung += r
        other += o
    stop.set()
    th.join()
    channel.close()
    out["event_variable (shipped)"] = {"rung_round_trip": stats_ms(rung), "iteration_overhead": stats_ms(other)}

    # (d) variable polled with a timeout
    from distributed import Queue, Variable

    def on_event(event):
        _, msg = event
        if prune.rung_of(msg["i"]) is not None:
            todo.put(f"bench-{msg['key']}-{msg['i']}")

    todo: queue.Queue = queue.Queue()
    client.subscribe_topic(TOPIC, on_event)
    stop.clear()

    def setter():
        while not stop.is_set():
            try:
                name = todo.get(timeout=0.1)
            except queue.Empty:
                continue
            Variable(name, client=client).set("continue")

    th = threading.Thread(target=setter)
    th.start()
    rung = []
    for t in range(tasks):
        res = client.submit(gated_variable, iters, f"v{t}-{time.time_ns()}", pure=False).result()
        rung += split(res, prune)[0]
    stop.set()
    th.join()
    client.unsubscribe_topic(TOPIC)
    out["variable_poll"] = {"rung_round_trip": stats_ms(rung)}

    # (e) queues both ways
    reports = Queue("bench-reports", client=client)
    stop.clear()

    def relay():
        while not stop.is_set():
            try:
                msg = reports.get(timeout=0.2)
            except TimeoutError:
                continue
            if prune.rung_of(msg["i"]) is not None:
                Queue(f"bench-{msg['key']}-{msg['i']}", client=client).put("continue")

    th = threading.Thread(target=relay)
    th.start()
    rung, other = [], []
    for t in range(tasks):
        res = client.submit(gated_queue, iters, f"q{t}-{time.time_ns()}", pure=False).result()
        r, o = split(res, prune)
        rung += r
        other += o
    stop.set()
    th.join()
    out["queue_both_ways"] = {"rung_round_trip": stats_ms(rung), "iteration_overhead": stats_ms(other)}
    return out


def measure_stops(client, n: int, cancels: int, tmp: Path) -> dict:
    out = {
        "event_is_set_poll": stats_ms(client.submit(poll_event, n, f"bench-ev-{time.time_ns()}", pure=False).result()),
        "local_cancel_check": stats_ms(client.submit(local_check, n, pure=False).result()),
    }
    lat = []
    for c in range(cancels):
        path = tmp / f"closed-{c}"
        seen = tmp / f"seen-{c}"
        got = threading.Event()
        ch = ReportChannel(client, lambda key, i, report: got.set())
        fut = client.submit(Iterative(endless), str(path), key=f"endless-{c}-{time.time_ns()}", pure=False)
        got.wait(60)
        ch.close()
        t = time.time()
        fut.cancel()
        while not path.exists():
            time.sleep(0.001)
        time.sleep(0.01)
        lat.append(float(path.read_text()) - t)
        seen.touch()
    out["cancel_to_finally"] = stats_ms(lat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reports", type=int, default=400)
    ap.add_argument("--gap", type=float, default=0.002)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--iterations", type=int, default=130)  # rungs 1, 2, 4, ..., 128: 8 per task
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "report_transport.json"))
    args = ap.parse_args()
    if args.quick:
        args.reports, args.tasks, args.iterations = 60, 2, 20
    import tempfile

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        client.submit(time.sleep, 0, pure=False).result()  # warm up: the workers' imports
        reports = measure_reports(client, args.reports, args.gap)
        gates = measure_gates(client, args.tasks, args.iterations)
        with tempfile.TemporaryDirectory() as tmp:
            stops = measure_stops(client, args.reports, 3 if args.quick else 8, Path(tmp))
    result = {
        "benchmark": "report_transport",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg(), "note": "shared by several engineers' test runs"},
        "args": {k: v for k, v in vars(args).items() if k != "output"},
        "reports": reports,
        "rung_answers": gates,
        "stopping": stops,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(f"reports, worker -> client ({args.reports} reports, {args.gap * 1e3:.0f} ms apart): median / p90 ms")
    for name, r in reports.items():
        print(f"  {name:12s} send {r['send']['median_ms']:8.3f} / {r['send']['p90_ms']:8.3f}"
              f"   latency {r['latency']['median_ms']:8.3f} / {r['latency']['p90_ms']:8.3f}")
    print("rung answer round trip in the step (report sent -> step resumes): median / p90 ms")
    for name, r in gates.items():
        extra = r.get("iteration_overhead")
        tail = f"   other iterations {extra['median_ms']:.3f} / {extra['p90_ms']:.3f}" if extra else ""
        print(f"  {name:26s} {r['rung_round_trip']['median_ms']:8.3f} / {r['rung_round_trip']['p90_ms']:8.3f}{tail}")
    print("stopping between rungs: per-iteration check, median / p90 ms")
    for name, r in stops.items():
        print(f"  {name:20s} {r['median_ms']:8.3f} / {r['p90_ms']:8.3f}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
