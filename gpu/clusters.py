"""One training cluster API for both kinds of host.

``cluster()`` returns a ``dask_cuda.LocalCUDACluster`` (one worker per GPU) where GPUs and
dask-cuda exist, and an equivalent CPU ``LocalCluster`` (one single-threaded worker process
per stand-in "GPU") otherwise, so the same script runs on both. ``workers_per_gpu=2`` gives
each GPU two dask-cuda workers (a one-GPU host then has a cross-worker path to exercise).

>>> with cluster(n_workers=2) as c:          # doctest: +SKIP
...     c.scheduler_address.startswith("tcp://127.0.0.1")
True
"""

from __future__ import annotations

import copy
import os
from typing import Any

__all__ = ["cluster", "default_workers", "gpu_count", "share_workers", "worker_share"]

_PROTOCOLS = {None: None, "tcp": "tcp", "ucx": "ucxx", "ucxx": "ucxx"}


def default_workers() -> int:
    """A local cluster's worker count when none is given (``graph.connect``'s embedded cluster,
    ``gpu.cluster`` without GPUs, a run's memory plan): one single-threaded worker process per
    core, at most four.

    >>> 1 <= default_workers() <= 4
    True
    """
    return max(1, min(4, os.cpu_count() or 1))


def gpu_count() -> int:
    """Number of CUDA devices torch can see (0 without torch or without a GPU)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def worker_share(budget: Any, n: int) -> int:
    """One worker's even share of a total budget (``"2 GiB"`` or bytes): the one rule for
    splitting a memory budget over workers (``graph.memory.limits.worker_limits`` uses it too).

    >>> worker_share("1 GiB", 2), worker_share(10, 3)
    (536870912, 3)
    """
    from dask.utils import parse_bytes

    return int(parse_bytes(budget) if isinstance(budget, str) else budget) // max(1, n)


def cluster(
    n_workers: int | None = None,
    *,
    protocol: str | None = None,
    threads_per_worker: int = 1,
    dashboard_address: str = "127.0.0.1:0",
    use_gpu: bool | None = None,
    memory_budget: Any = None,
    device_memory_budget: Any = None,
    workers_per_gpu: int = 1,
    **kwargs: Any,
):
    """Start a local training cluster.

    ``protocol``: ``None``/``"tcp"`` or ``"ucx"``/``"ucxx"`` (needs the ``ucx`` extra:
    ``distributed-ucxx-cu12``; it works on CPU too). ``use_gpu``: ``None`` picks GPUs when
    present. Extra keyword arguments go to the cluster class (e.g. ``memory_limit``,
    ``device_memory_limit`` on GPU hosts).

    ``memory_budget``: total host memory for all workers, split evenly into their
    ``memory_limit`` (what ``node.run(memory_budget=...)`` plans for; the run installs its
    plan's eviction order on the workers' spill buffers).
    ``device_memory_budget`` (GPU hosts): total GPU memory for results, split into each
    worker's ``device_memory_limit``, above which dask-cuda spills device -> host.
    ``workers_per_gpu`` (GPU hosts): dask-cuda workers sharing each GPU (default 1, dask-cuda's
    one per GPU); ``n_workers`` then counts up to ``gpus * workers_per_gpu``. Budgets are split
    over all workers, so two workers on one GPU each get half its ``device_memory_budget``.
    """
    if not isinstance(workers_per_gpu, int) or isinstance(workers_per_gpu, bool) or workers_per_gpu < 1:
        raise ValueError(f"workers_per_gpu={workers_per_gpu!r} must be an int >= 1 (e.g. 2 to share each GPU by two workers)")
    if protocol not in _PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}: use None, 'tcp', 'ucx' or 'ucxx'")
    proto = _PROTOCOLS[protocol]
    if proto == "ucxx":
        try:
            import distributed_ucxx  # noqa: F401
        except ImportError:
            raise ValueError(
                "protocol='ucxx' needs the ucx extra: pip install 'quiver[ucx]' (distributed-ucxx-cu12)"
            ) from None
    gpus = gpu_count()
    if use_gpu is None:
        use_gpu = gpus > 0
    common: dict[str, Any] = dict(dashboard_address=dashboard_address, **kwargs)
    slots = gpus * workers_per_gpu
    n = (min(n_workers or slots, slots) if use_gpu else n_workers or default_workers()) or 1
    if memory_budget is not None:
        common["memory_limit"] = worker_share(memory_budget, n)
    if device_memory_budget is not None:
        if not use_gpu:
            raise ValueError("device_memory_budget applies to GPU workers; this cluster has none")
        common["device_memory_limit"] = worker_share(device_memory_budget, n)
    if proto:
        common["protocol"] = proto
    if use_gpu:
        if gpus == 0:
            raise ValueError("use_gpu=True but no CUDA device is visible to torch")
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ValueError("GPU clusters need the gpu extra: pip install 'quiver[gpu]' (dask-cuda[cu12])") from None
        devices = -(-n // workers_per_gpu)  # GPUs in use: ceil(n / workers_per_gpu)
        if n_workers is not None or workers_per_gpu > 1:
            common["CUDA_VISIBLE_DEVICES"] = list(range(devices))
        c = LocalCUDACluster(threads_per_worker=threads_per_worker, **common)
        if n > devices:
            try:
                share_workers(c, n)
            except BaseException:  # re-raised: the half-built cluster is closed first
                c.close()
                raise
        return c
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        **common,
    )


def share_workers(spec_cluster: Any, n_workers: int) -> None:
    """Grow a started ``SpecCluster`` (``LocalCUDACluster``, ``LocalCluster``) to ``n_workers``
    by starting copies of its workers' specs, round-robin.

    dask-cuda names each worker after its GPU and refuses to scale past the visible GPUs; a
    copy of a worker's spec (same ``CUDA_VISIBLE_DEVICES``, plugins and device spill settings)
    under a new name is a second worker on the same GPU. Returns once the new workers run.
    """
    names = list(spec_cluster.worker_spec)
    if not names:
        raise ValueError("share_workers: the cluster has no worker spec to copy; start it with n_workers >= 1")
    for i in range(len(names), n_workers):
        base = names[i % len(names)]
        spec_cluster.worker_spec[f"{base}-{i // len(names)}"] = copy.deepcopy(spec_cluster.worker_spec[base])
    spec_cluster.sync(_settled, spec_cluster)  # Dask starts the new specs' workers (SpecCluster.__await__)


async def _settled(spec_cluster: Any) -> None:
    """Return once ``spec_cluster``'s workers match its spec (``SpecCluster.__await__``, public:
    Dask starts the workers of the specs added, and raises what a start raised)."""
    await spec_cluster
