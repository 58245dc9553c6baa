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


def cluster(
    n_workers: int | None = None,
    *,
    protocol: str | None = None,
    threads_per_worker: int = 1,
    dashboard_address: str = "127.0.0.1:0",
    use_gpu: bool | None = None,
    **kwargs: Any,
):
    """Start a local training cluster.

    ``protocol``: ``None``/``"tcp"`` or ``"ucx"``/``"ucxx"`` (needs the ``ucx`` extra:
    ``distributed-ucxx-cu12``; it works on CPU too). ``use_gpu``: ``None`` picks GPUs when
    present. Extra keyword arguments go to the cluster class (e.g. ``memory_limit``,
    ``device_memory_limit`` on GPU hosts).
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
        n_workers=n_workers or max(1, min(4, os.cpu_count() or 1)),
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        **common,
    )
