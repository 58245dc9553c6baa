"""gpu.train on real worker processes: gangs, identical central models, resume after a real kill."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import pytest
import torch

import gpu
from gpu.algorithms import ALGORITHMS, SMA, SSGD
from gpu.engine import Solo, TrainConfig, run_member
from gpu.gang import run_gang
from gpu.training import _train_member
from pipelines import Pipeline, grid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # slow: torch training on workers

MLP = functools.partial(gpu.MLP, 64, 10, hidden=(32,))


@pytest.fixture(scope="module")
def digits():
    return gpu.load_digits_tensors(seed=0)


# ------------------------------------------------------------------ the engine, in this process


class Mirror:
    """Rank 0 of 2 whose peer is its mirror image: the all-reduce doubles, and (when given) the
    network measures ``bandwidth`` bytes/s with no latency. Records every all-reduce's size."""

    rank, size = 0, 2

    def __init__(self, bandwidth=None):
        self.sizes = []
        if bandwidth is not None:
            self.bandwidth = lambda nbytes: (bandwidth, 0.0)

    def allreduce(self, t):
        self.sizes.append(t.numel())
        return t * 2

    def checkpoint(self, state):
        self.last = state


def test_auto_partitions_without_tuning_decide_from_measured_compute(digits):
    """Fails before the algorithm objects: with replicas given, partitions='auto' read a timer
    that no step had filled yet (compute 1e-6 s), and split the sync into ~1000 slices."""
    n = sum(p.numel() for p in MLP().parameters())
    ctx = Mirror(bandwidth=1e7)  # a whole exchange (~10 KB) costs ~1 ms
    out = run_member(ctx, digits, MLP, TrainConfig(epochs=1, replicas=2, partitions="auto"))
    # one step of 2 x 16 samples computes for well over 20 us, so at most ~50 slices fit the rule
    assert 1 <= out["partitions"] <= 50, out["partitions"]
    assert out["partitions"] < n
    assert out["timings"]["partitions_s"] > 0


def test_tuning_measures_the_sync_that_training_uses(digits):
    """Fails before: the tuner's steps exchanged whole corrections while training sent 1/3 slices."""
    n = sum(p.numel() for p in MLP().parameters())
    ctx = Mirror()
    out = run_member(ctx, digits, MLP, TrainConfig(epochs=2, replicas="auto", max_replicas=2, partitions=3))
    assert out["replicas_source"] == "tuned" and out["partitions"] == 3
    slices = {-(-n // 3), n // 3}
    # whole vectors only at the end of each epoch (what the slices held back); the tuner's
    # throughput reports are 2-element all-reduces
    assert ctx.sizes.count(n) == 2
    assert set(ctx.sizes) <= slices | {n, 2}


def test_tuned_run_trains_the_model_a_given_count_trains(digits):
    """Fails before: the tuner's steps trained the returned model, so 'auto' gave results that
    no run with a fixed count reproduces."""
    tuned = run_member(Solo(), digits, MLP, TrainConfig(epochs=2, replicas="auto", max_replicas=3))
    assert tuned["replicas_source"] == "tuned" and tuned["tuning_samples"] > 0
    given = run_member(Solo(), digits, MLP, TrainConfig(epochs=2, replicas=tuned["replicas"]))
    assert given["replicas_source"] == "given" and given["tuning"] == []
    assert torch.equal(tuned["z"], given["z"])
    assert [h["accuracy"] for h in tuned["history"]] == [h["accuracy"] for h in given["history"]]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_through_the_same_loop(digits, name):
    cfg = TrainConfig(epochs=2, lr=0.05, replicas=2, algorithm=name, lr_drops=(1,))
    out = run_member(Solo(), digits, MLP, cfg)
    assert [h["lr"] for h in out["history"]] == pytest.approx([0.05, 0.005])
    assert out["history"][-1]["accuracy"] > 0.7
    assert all(h["train_s"] > 0 and h["eval_s"] > 0 for h in out["history"])
    # the checkpoint of the last epoch restores to the same weights
    algo = ALGORITHMS[name](MLP(), cfg, 2, lambda t: t)
    algo.restore({"z": out["z"], "delta_prev": out["delta_prev"]})
    assert torch.equal(algo.weights, out["z"])


def test_algorithm_objects_and_bad_combinations():
    assert ALGORITHMS == {"sma": SMA, "ssgd": SSGD}
    assert SMA.tunable and SMA.partitionable and not SSGD.tunable and not SSGD.partitionable
    with pytest.raises(ValueError, match="partitions=2 splits SMA's sync"):
        TrainConfig(algorithm="ssgd", replicas=2, partitions=2)
    with pytest.raises(ValueError, match="use one of \\['sma', 'ssgd'\\]"):
        TrainConfig(algorithm="adam")


# ------------------------------------------------------------------ on the cluster


def test_final_central_model_is_bit_identical_on_both_workers(client, digits):
    cfg = TrainConfig(epochs=2, lr=0.05, batch_size=16, replicas=2)
    member = functools.partial(_train_member, data=digits, model=MLP, cfg=cfg, resume=None, checkpoint_name="quiver-test-ckpt")
    results = run_gang(client, member, None, timeout=30)
    assert len(results) == 2
    z0, z1 = results[0]["z"], results[1]["z"]
    assert torch.equal(z0, z1)
    assert not torch.equal(z0, torch.zeros_like(z0))
    # the two members trained different shards, yet agree on z: that is the all-reduce at work
    assert results[0]["history"][-1]["accuracy"] == results[1]["history"][-1]["accuracy"]


def test_train_as_a_function_on_two_workers(client, digits):
    out = gpu.train(digits, model=MLP, epochs=3, lr=0.05, batch_size=16, replicas=2)
    assert out["workers"] == 2 and out["restarts"] == 0
    # where the time went, in the result: training loops, and the rest of the call
    assert out["training_seconds"] == pytest.approx(sum(h["train_s"] for h in out["history"]))
    waited = out["queued_seconds"]  # for another gang's admission lock (none here)
    assert out["overhead_seconds"] == pytest.approx(out["wall_seconds"] - out["training_seconds"] - waited)
    assert out["admission_seconds"] > 0 and out["data_seconds"] > 0
    # replicas and partitions given: no tuning ran (no curve, no samples spent, no partition search)
    assert out["replicas_source"] == "given"
    assert out["tuning"] == [] and out["tuning_samples"] == 0 and out["sync_tuning"] == {}
    assert out["accuracy"] > 0.85
    assert len(out["history"]) == 3 and out["history"][-1]["samples_per_s"] > 0
    with torch.no_grad():
        logits = out["model"](digits.x_test)
    acc = (logits.argmax(1) == digits.y_test).float().mean().item()
    assert acc == pytest.approx(out["accuracy"], abs=1e-6)


def test_ssgd_baseline_in_the_same_engine(client, digits):
    out = gpu.train(digits, model=MLP, epochs=3, lr=0.1, batch_size=16, replicas=2, algorithm="ssgd")
    assert out["algorithm"] == "ssgd" and out["workers"] == 2
    assert out["accuracy"] > 0.8


def test_auto_replicas_are_recorded_and_reused_on_the_cluster(client, digits):
    model = functools.partial(gpu.MLP, 64, 10, hidden=(24,))  # a model no other test tunes
    first = gpu.train(digits, model=model, epochs=2, replicas="auto", max_replicas=3)
    again = gpu.train(digits, model=model, epochs=2, replicas="auto", max_replicas=3, lr=0.1)
    assert first["replicas_source"] == "tuned" and first["tuning_seconds"] > 0
    assert [k for k, _ in first["tuning"]] == list(range(1, len(first["tuning"]) + 1))
    # the same model, data, batch and workers: the cluster remembers the choice (lr does not matter)
    assert again["replicas_source"] == "remembered" and again["replicas"] == first["replicas"]
    assert again["tuning"] == first["tuning"] and again["tuning_samples"] == 0
    # and the tuned run is the run given that count: a rerun reproduces it
    given = gpu.train(digits, model=model, epochs=2, replicas=first["replicas"])
    assert given["accuracy"] == first["accuracy"]
    for a, b in zip(given["model"].parameters(), first["model"].parameters()):
        assert torch.equal(a, b)


def test_target_accuracy_stops_early(client, digits):
    out = gpu.train(digits, model=MLP, epochs=10, lr=0.05, batch_size=16, replicas=2, target_accuracy=0.5)
    assert out["epochs_to_target"] is not None and out["epochs"] == out["epochs_to_target"] < 10
    assert out["seconds_to_target"] > 0


def test_two_training_branches_explored_at_once_both_complete(client):
    runs = (
        Pipeline("two-gangs")
        .source(gpu.load_digits_tensors, seed=0)
        .explore("train", grid(gpu.train, model=[MLP], lr=[0.02, 0.05], epochs=[2], replicas=[2]))
    )
    result = runs.choose("accuracy", k=2).run(client, progress=False, quiet=True)
    assert (result.table["status"] == "ok").all()
    assert len(result.value) == 2
    assert all(v["workers"] == 2 for v in result.value)
    assert {"replicas", "samples_per_s", "epochs"} <= set(result.table.columns)


def test_concurrent_auto_branches_share_one_tuning(client):
    """Two branches tuning at once used to choose separately (3 vs 6 replicas in one report):
    now one tunes while the other waits for its choice."""
    model = functools.partial(gpu.MLP, 64, 10, hidden=(20,))  # a model no other test tunes
    runs = (
        Pipeline("two-auto")
        .source(gpu.load_digits_tensors, seed=0)
        .explore("train", grid(gpu.train, model=[model], lr=[0.02, 0.05], epochs=[1], max_replicas=[3]))
    )
    result = runs.choose("accuracy", k=2).run(client, progress=False, quiet=True)
    values = result.values
    assert sorted(v["replicas_source"] for v in values) == ["remembered", "tuned"]
    assert values[0]["replicas"] == values[1]["replicas"]
    assert "replicas_source" in result.table.columns and "overhead_seconds" in result.table.columns


def test_bad_arguments_fail_before_training(digits):
    with pytest.raises(ValueError, match="algorithm='adam'"):
        gpu.train(digits, model=MLP, algorithm="adam", workers=1)
    with pytest.raises(ValueError, match="replicas='auto' tunes SMA"):
        gpu.train(digits, model=MLP, algorithm="ssgd", workers=1)
    with pytest.raises(ValueError, match="x_train"):
        gpu.train({"x": 1}, model=MLP, workers=1)
    with pytest.raises(ValueError, match="cannot fill one step"):
        gpu.train(digits, model=MLP, batch_size=4096, replicas=1, epochs=1, workers=1)


def test_auto_tuning_reports_its_curve(digits):
    out = gpu.train(digits, model=MLP, epochs=1, replicas="auto", max_replicas=3, workers=1)
    curve = out["tuning"]
    assert [k for k, _ in curve] == list(range(1, len(curve) + 1))
    assert 1 <= out["replicas"] <= 3 and all(rate > 0 for _, rate in curve)


def _kill_rank_1_after_first_checkpoint(client, stop: threading.Event):
    from distributed import Variable

    pids = client.run(os.getpid)
    victim = sorted(pids)[1]
    while not stop.is_set():
        names = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.extensions["variables"].variables))
        for name in (n for n in names if n.startswith("quiver-checkpoint-")):
            if Variable(name, client=client).get(timeout=5):  # b"" until the first epoch's checkpoint
                os.kill(pids[victim], signal.SIGKILL)
                return
        time.sleep(0.05)


def test_killing_a_worker_mid_training_resumes_from_the_checkpoint(digits):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        stop = threading.Event()
        killer = threading.Thread(target=_kill_rank_1_after_first_checkpoint, args=(c, stop), daemon=True)
        killer.start()
        try:
            out = gpu.train(digits, model=MLP, epochs=6, lr=0.05, batch_size=8, replicas=2, timeout=10)
        finally:
            stop.set()
            killer.join(5)
    assert out["restarts"] >= 1
    assert out["epochs"] == 6 and [h["epoch"] for h in out["history"]] == [1, 2, 3, 4, 5, 6]
    assert out["accuracy"] > 0.8


def test_cluster_is_a_cpu_local_cluster_here():
    if gpu.gpu_count():
        pytest.skip("this machine has a GPU: gpu.cluster() gives a LocalCUDACluster")
    with gpu.cluster(n_workers=1) as c:
        assert type(c).__name__ == "LocalCluster"
        assert c.scheduler_address.startswith("tcp://127.0.0.1")
    with pytest.raises(ValueError, match="protocol='quic'"):
        gpu.cluster(protocol="quic")
    with pytest.raises(ValueError, match="workers_per_gpu=0 must be an int >= 1"):
        gpu.cluster(workers_per_gpu=0)


def test_share_workers_starts_copies_of_a_workers_spec_as_more_processes():
    """What gpu.cluster(workers_per_gpu=2) does to a LocalCUDACluster, on a CPU LocalCluster
    (the same SpecCluster machinery): copies of the one worker's spec, under new names, run as
    separate worker processes that tasks reach."""
    import os

    from distributed import Client, LocalCluster

    from gpu.clusters import share_workers

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as c, Client(c) as client:
        share_workers(c, 3)
        assert sorted(map(str, c.worker_spec)) == ["0", "0-1", "0-2"]
        client.wait_for_workers(3, timeout=60)
        pids = client.run(os.getpid)
        assert len(pids) == 3 and len(set(pids.values())) == 3
        assert sorted(map(str, (w["name"] for w in client.scheduler_info()["workers"].values()))) == ["0", "0-1", "0-2"]


def test_share_workers_gives_a_local_cuda_cluster_a_second_worker_on_the_same_gpu(monkeypatch):
    """The same on dask-cuda's own LocalCUDACluster, in its device-less test mode (dask-cuda's
    DASK_CUDA_TEST_DISABLE_DEVICE_SPECIFIC): it names workers after GPUs and will not scale past
    them, and the copy runs as a second process told the same CUDA_VISIBLE_DEVICES."""
    pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (the gpu extra; make gpu-wheels has it)")
    import os

    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from gpu.clusters import share_workers

    monkeypatch.setenv("DASK_CUDA_TEST_DISABLE_DEVICE_SPECIFIC", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=[0], threads_per_worker=1, dashboard_address="127.0.0.1:0",
                          device_memory_limit=None) as c, Client(c) as client:
        with pytest.raises(ValueError, match="Can not scale beyond visible devices"):
            c.scale(2)  # why share_workers exists
        share_workers(c, 2)
        client.wait_for_workers(2, timeout=60)
        seen = client.run(lambda: (os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")))
        assert sorted(map(str, c.worker_spec)) == ["0", "0-1"]
    assert len({pid for pid, _ in seen.values()}) == 2 and {v for _, v in seen.values()} == {"0"}
