"""SMA training on Dask workers: replica groups, worker-to-worker sync, auto-tuning.

Importing ``gpu`` is cheap: torch and the submodules load on first use of a name.

>>> import gpu
>>> cfg = gpu.SMAConfig(lr=0.05)            # Crossbow's defaults for the rest
>>> (cfg.alpha, cfg.momentum, cfg.central_momentum, cfg.sync_every)
(0.1, 0.9, 0.9, 1)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    # SMA maths (pure, single process)
    "AllReduce": "gpu.sma",
    "SMAConfig": "gpu.sma",
    "SMAState": "gpu.sma",
    "local_step": "gpu.sma",
    "local_correction": "gpu.sma",
    "central_update": "gpu.sma",
    "reset_replicas": "gpu.sma",
    "sma_step": "gpu.sma",
    "ssgd_update": "gpu.sma",
    "ssgd_step": "gpu.sma",
    # replica groups
    "ParamLayout": "gpu.replicas",
    "ReplicaGroup": "gpu.replicas",
    "SSGDGroup": "gpu.replicas",
    "replica_batches": "gpu.replicas",
    # tuners (pure)
    "ReplicaTuner": "gpu.tuning",
    "exchange_seconds": "gpu.tuning",
    "choose_partitions": "gpu.tuning",
    "partition_bounds": "gpu.tuning",
    "SyncSlice": "gpu.tuning",
    "PartitionedSync": "gpu.tuning",
    # models and data shipped with packages
    "DataSplit": "gpu.models",
    "MLP": "gpu.models",
    "SmallResNet": "gpu.models",
    "load_digits_tensors": "gpu.models",
    "load_mnist_tensors": "gpu.models",
    "synthetic_cifar": "gpu.models",
    # several training runs packed into one stacked group
    "PackedTrainer": "gpu.packing",
    "tune_members": "gpu.packing",
    # a user's own training loop, declared so that a run can pack it
    "Checkpoint": "gpu.loops",
    "Loop": "gpu.loops",
    "PackedLoop": "gpu.loops",
    "train_loop": "gpu.loops",
    # training as a pipeline step, and clusters for both kinds of host
    "train": "gpu.training",
    "TrainConfig": "gpu.engine",
    "cluster": "gpu.clusters",
    "gpu_count": "gpu.clusters",
    # worker-to-worker collectives and gangs
    "Collective": "gpu.allreduce",
    "CollectiveError": "gpu.allreduce",
    "measure_bandwidth": "gpu.allreduce",
    "BandwidthProfile": "gpu.allreduce",
    "choose_algorithm": "gpu.allreduce",
    "run_gang": "gpu.gang",
    "GangError": "gpu.gang",
    "GangContext": "gpu.gang",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gpu' has no attribute {name!r}")
