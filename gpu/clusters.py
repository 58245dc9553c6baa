"""One training cluster API for both kinds of host.

``cluster()`` returns a ``dask_cuda.LocalCUDACluster`` (one worker per GPU) where GPUs and
dask-cuda exist, and an equivalent CPU ``LocalCluster`` (one single-threaded worker process
per stand-in "GPU") otherwise, so the same script runs on both.

>>> with cluster(n_workers=2) as c:          # doctest: +SKIP
...     c.scheduler_address.startswith("tcp://127.0.0.1")
True
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["cluster", "gpu_count"]

_PROTOCOLS = {None: None, "tcp": "tcp", "ucx": "ucxx", "ucxx": "ucxx"}


def gpu_count() -> int:
    """Number of CUDA devices torch can see (0 without torch or without a GPU)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _share(budget: Any, n: int) -> int:
    """One worker's even share of a total budget (``"2 GiB"`` or bytes)."""
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
    """
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
    n = (min(n_workers or gpus, gpus) if use_gpu else n_workers or max(1, min(4, os.cpu_count() or 1))) or 1
    if memory_budget is not None:
        common["memory_limit"] = _share(memory_budget, n)
    if device_memory_budget is not None:
        if not use_gpu:
            raise ValueError("device_memory_budget applies to GPU workers; this cluster has none")
        common["device_memory_limit"] = _share(device_memory_budget, n)
    if proto:
        common["protocol"] = proto
    if use_gpu:
        if gpus == 0:
            raise ValueError("use_gpu=True but no CUDA device is visible to torch")
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ValueError("GPU clusters need the gpu extra: pip install 'quiver[gpu]' (dask-cuda[cu12])") from None
        if n_workers is not None:
            common["CUDA_VISIBLE_DEVICES"] = list(range(min(n_workers, gpus)))
        return LocalCUDACluster(threads_per_worker=threads_per_worker, **common)
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        **common,
    )
