"""``gpu.train``: SMA (or S-SGD) training as a pipeline step, one gang member per Dask worker.

Use it like any step, alone or inside ``explore``/``grid``::

    from functools import partial
    from pipelines import Pipeline, grid
    import gpu

    mlp = partial(gpu.MLP, 784, 10)
    runs = (Pipeline("mnist").source(gpu.load_mnist_tensors, seed=0)
            .explore("train", grid(gpu.train, model=[mlp], batch_size=[16, 64], lr=[0.02, 0.05], epochs=[3])))
    best = runs.choose("accuracy")

Inside a Dask task (a pipeline step) it trains on every worker of the cluster (or
``workers=N`` of them: its own worker first, then the least busy) as a gang; outside Dask, or
with ``workers=1``, in this process. It is an iterative step (docs/architecture.md §7):
``train.__quiver_iterate__`` (:func:`iterate`) yields one report per epoch, and closing it
stops the training at the next epoch boundary, every gang member alike.
Each epoch, rank 0 checkpoints the central model ``z`` in a ``distributed.Variable``; if a
worker dies, the run resumes on the remaining workers from the last checkpoint (at most
``max_restarts`` times), and says so in the result.

>>> import functools, gpu
>>> out = train(gpu.load_digits_tensors(seed=0), model=functools.partial(gpu.MLP, 64, 10),
...             epochs=2, replicas=2, workers=1)                   # doctest: +SKIP
>>> sorted(k for k in out if k != "history")[:4]                  # doctest: +SKIP
['accuracy', 'algorithm', 'epochs', 'epochs_to_target']
"""

from __future__ import annotations

import functools
import logging
import pickle
import time
import uuid
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from .engine import Solo, TrainConfig, iter_member, tune_member

__all__ = ["train", "iterate", "pick_workers"]

logger = logging.getLogger(__name__)


def _as_data(data: Any) -> Any:
    need = ("x_train", "y_train", "x_test", "y_test")
    if isinstance(data, Mapping):
        missing = [k for k in need if k not in data]
        if missing:
            raise ValueError(f"train: data is missing {missing}; give x_train, y_train, x_test, y_test tensors")
        return SimpleNamespace(**{k: data[k] for k in need})
    missing = [k for k in need if not hasattr(data, k)]
    if missing:
        raise ValueError(
            f"train: data ({type(data).__name__}) has no {missing}; pass a gpu.DataSplit "
            "(e.g. gpu.load_mnist_tensors()) or a dict with x_train, y_train, x_test, y_test"
        )
    return data


def _client_available() -> bool:
    """Whether a Dask client is at hand (inside a task, the worker's; outside, a default one):
    ``train(workers>1)`` then runs a gang, else trains alone. Inside a task the worker's client
    comes through :func:`gpu.worker.task_client` (the one way a task gets it: a fault can make
    Dask's client start fail with a bare ``AssertionError``, which is waited out, not raised);
    a task the run let go meanwhile trains alone and is closed at its next report."""
    from distributed import get_client

    from .worker import current_worker, task_client

    if current_worker() is not None:
        return task_client() is not None
    try:
        get_client()
        return True
    except ValueError:  # get_client() with no client anywhere: "No global client found"
        return False


class _GangMember:
    """Adapts a gang context to what :func:`gpu.engine.run_member` expects."""

    def __init__(self, ctx: Any, checkpoint_name: str):
        self.ctx = ctx
        self.rank, self.size = ctx.rank, ctx.size
        self.checkpoint_name = checkpoint_name

    def allreduce(self, t):
        return self.ctx.collective.allreduce_(t.clone())

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this member's collective has sent (the comm layer's own counter)."""
        return self.ctx.collective.bytes_sent

    def bandwidth(self, nbytes: int) -> tuple[float, float]:
        from .allreduce import measure_bandwidth

        # probed on the gang's own collective, i.e. the worker-to-worker links the sync uses; a
        # quarter of the model at most, since a shaped 20 Mbit/s link takes seconds per full exchange
        sizes = sorted({max(64 << 10, nbytes // 16), max(128 << 10, nbytes // 4)})
        profile = measure_bandwidth(self.ctx.collective, sizes, repeats=3)
        return profile.bandwidth, profile.latency

    def checkpoint(self, state: dict) -> None:
        from distributed import Variable

        Variable(self.checkpoint_name).set(pickle.dumps(state))


# The Quiver dashboard (graph/dashboard.py) reads these events; gpu cannot import graph, so the
# topic name is repeated here (graph.dashboard.protocol.TRAINING_TOPIC; a test checks they agree).
TRAINING_TOPIC = "quiver-training"


def _current_task() -> str | None:
    """The key of the Dask task running this code (the training step), or ``None`` outside Dask."""
    from .worker import current_task

    return current_task()


def _publisher(task: str | None, rank: int, size: int) -> Callable[[dict], None]:
    """``publish(msg)``: log ``msg`` on the ``quiver-training`` topic from this worker (no-op outside one)."""
    from .worker import current_worker

    worker = current_worker()
    if worker is None or task is None:
        return lambda msg: None

    def publish(msg: dict) -> None:
        try:
            body = {"task": task, "rank": rank, "size": size, "worker": worker.address}
            body.update({k: (float(v) if isinstance(v, float) else v) for k, v in msg.items()})
            worker.log_event(TRAINING_TOPIC, body)
        except Exception as exc:  # recorded: progress is a view, training never fails because of it
            logger.debug("quiver: cannot publish a training event: %s", exc)

    return publish


def _observed(ctx, data, model, cfg: TrainConfig, resume, task: str | None, tuned: dict | None = None):
    """``iter_member`` with its progress published (start, tuning, every epoch, end): a
    generator yielding each epoch's record and returning the result; ``send(True)`` stops it
    at that epoch boundary (as :func:`gpu.engine.iter_member`)."""
    publish = _publisher(task, ctx.rank, ctx.size)
    if ctx.rank == 0:
        publish({"kind": "start", "algorithm": cfg.algorithm, "epochs": cfg.epochs, "lr": cfg.lr,
                 "batch_size": cfg.batch_size, "replicas": str(cfg.replicas)})

    def on_tune(curve: list) -> None:
        if ctx.rank == 0:
            publish({"kind": "tuning", "tuning": [[int(k), float(r)] for k, r in curve]})

    epochs = iter_member(ctx, data, model, cfg, resume=resume, on_tune=on_tune, tuned=tuned)
    done = 0
    try:
        stopping = None
        while True:
            rec = next(epochs) if stopping is None else epochs.send(stopping)
            done = rec["epoch"]
            publish({"kind": "epoch", "epochs": cfg.epochs, **_scalars(rec)})
            stopping = yield rec
    except StopIteration as end:
        return end.value
    finally:
        publish({"kind": "end", "epochs_done": done})


def _scalars(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if isinstance(v, (int, float, str))}


def _drain(gen, stop: Callable[[], bool] | None = None, each: Callable[[dict], None] | None = None) -> Any:
    """Run a generator of epoch records to its end (``stop()`` true after an epoch ends it
    there; ``each(record)`` sees every record); its return value."""
    try:
        rec = next(gen)
        while True:
            if each is not None:
                each(rec)
            rec = gen.send(stop is not None and bool(stop()))
    except StopIteration as end:
        return end.value


def _train_member(ctx, data, model, cfg: TrainConfig, resume, checkpoint_name, task=None, tuned=None,
                  run: str | None = None):
    """A gang member's training. ``run`` (the coordinator's name for this training, when it
    iterates): rank 0 puts each epoch's record on the ``distributed.Queue`` ``{run}-epochs``,
    and after every epoch the members ask rank 0 whether the ``distributed.Event``
    ``{run}-stop`` is set (one tiny all-reduce: every member stops at the same boundary)."""
    member = _GangMember(ctx, checkpoint_name)
    epochs = _observed(member, _as_data(data), model, cfg, resume, task, tuned)
    if run is None:
        return _drain(epochs)
    import torch
    from distributed import Event, Queue

    from .worker import task_client

    client = task_client(lambda: False)  # a gang member's task: waits while a fault leaves the client connecting
    queue = Queue(f"{run}-epochs", client=client) if ctx.rank == 0 else None
    stop_event = Event(f"{run}-stop", client=client)

    def each(rec: dict) -> None:
        if queue is not None:
            queue.put(_scalars(rec))

    def stop() -> bool:
        flag = float(stop_event.is_set()) if ctx.rank == 0 else 0.0
        return member.allreduce(torch.tensor([flag])).item() > 0

    return _drain(epochs, stop, each)


def _tune(ctx, data, model, cfg: TrainConfig, task=None):
    """A gang member that only tunes the replicas (see :func:`gpu.engine.tune_member`)."""
    publish = _publisher(task, ctx.rank, ctx.size)

    def on_tune(curve: list) -> None:
        if ctx.rank == 0:
            publish({"kind": "tuning", "tuning": [[int(k), float(r)] for k, r in curve]})

    return tune_member(_GangMember(ctx, ""), _as_data(data), model, cfg, on_tune=on_tune)


def _last_checkpoint(name: str, client=None) -> dict | None:
    """The last checkpoint rank 0 published (``None`` before the first epoch ended)."""
    from distributed import Variable

    blob = Variable(name, client=client).get()  # set to b"" before the first gang: never a timed wait
    return pickle.loads(blob) if blob else None


def train(
    data: Any,
    *,
    model: Callable[[], Any],
    epochs: int = 5,
    lr: float = 0.05,
    batch_size: int = 16,
    replicas: int | str = "auto",
    algorithm: str = "sma",
    target_accuracy: float | None = None,
    workers: int | None = None,
    lr_drops: tuple[int, ...] = (),
    lr_drop_factor: float = 0.1,
    seed: int = 0,
    momentum: float = 0.9,
    central_momentum: float = 0.9,
    alpha: float = 0.1,
    weight_decay: float = 1e-4,
    sync_every: int = 1,
    max_replicas: int = 8,
    partitions: int | str = 1,
    max_restarts: int = 2,
    timeout: float = 60.0,
) -> dict:
    """Train ``model()`` on ``data`` with SMA (default) or S-SGD; return the central model and history.

    ``data``: a :class:`gpu.DataSplit` or a mapping with ``x_train``, ``y_train``, ``x_test``,
    ``y_test`` tensors. ``model``: a zero-argument callable building the ``nn.Module`` (every
    worker builds it under ``torch.manual_seed(seed)``, so all start from the same weights).
    ``replicas``: per worker; ``"auto"`` tunes it (SMA only, Crossbow's +10% rule).
    ``algorithm``: ``"sma"`` or ``"ssgd"`` (gradients averaged over all replicas every step).
    ``lr_drops``: epochs (0-based) at which the learning rate is multiplied by
    ``lr_drop_factor`` (SMA resets every replica to ``z`` there). ``partitions``: split each
    sync into a rotating 1/p slice (``"auto"``: sized from the measured bandwidth, after Ako).
    ``target_accuracy``: stop once ``z`` reaches it on the test split. ``workers``: how many
    Dask workers train as one gang (``None``: all; ``1``: this process only). ``timeout``
    bounds every wait on a peer (seconds).

    Returns ``model`` (an ``nn.Module`` holding ``z``), ``accuracy`` and ``test_loss`` of ``z``
    on the test split, ``history`` (per epoch: losses, accuracy, samples/s, compute and sync
    seconds, replicas, spread of the replicas around ``z``), ``epochs``, ``seconds`` (from the
    first data touch, evaluation and tuning included), ``epochs_to_target`` and
    ``seconds_to_target`` (``None`` if not reached), ``replicas`` and ``replicas_source``
    (``"given"``, ``"tuned"``, ``"remembered"``: tuned earlier on this cluster for the same
    model, data shapes, batch and workers, or ``"checkpoint"``), ``tuning`` (the auto-tuner's
    ``(replicas, samples/s)`` curve, measured on a scratch copy: a tuned run trains the model
    ``replicas=<count>`` trains; ``tuning_samples`` its measurement steps), ``partitions``,
    ``workers``, ``restarts`` and ``restart_errors`` (why each restart happened); and where the
    time went: ``training_seconds`` (the epochs' step loops), ``wall_seconds`` (this call),
    ``queued_seconds`` (waiting for other gangs), ``overhead_seconds`` (wall less training less
    queued), ``admission_seconds``, ``data_seconds`` (scattering the data to the workers, once)
    and ``tuning_seconds``.
    """
    return _drain(iterate(**locals()))


def iterate(data: Any, **kwargs: Any):
    """``gpu.train`` as an iterative step: a generator yielding one report per epoch (the
    epoch's history record: ``accuracy``, ``test_loss``, ``train_loss`` and ``loss`` (the
    same), ``samples_per_s``, ...) and returning what :func:`train` returns. Takes
    :func:`train`'s arguments. Closing it (a pruned branch) stops the training at the next
    epoch boundary: alone, at once (the generator is suspended there); a gang's members stop
    together at the end of their current epoch and free their workers before ``close``
    returns. ``graph.tasks.iterative`` calls it through ``train.__quiver_iterate__``.

    >>> gen = iterate(gpu.load_digits_tensors(), model=functools.partial(gpu.MLP, 64, 10),
    ...               epochs=5, workers=1, replicas=1)                        # doctest: +SKIP
    >>> next(gen)["epoch"], next(gen)["epoch"]                                # doctest: +SKIP
    (1, 2)
    >>> gen.close()                                                           # doctest: +SKIP
    """
    import inspect

    bound = inspect.signature(train).bind(data, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    t_call = time.perf_counter()
    model, workers = a["model"], a["workers"]
    cfg = TrainConfig(
        epochs=a["epochs"], lr=a["lr"], batch_size=a["batch_size"], replicas=a["replicas"],
        algorithm=a["algorithm"], target_accuracy=a["target_accuracy"], momentum=a["momentum"],
        central_momentum=a["central_momentum"], alpha=a["alpha"], weight_decay=a["weight_decay"],
        sync_every=a["sync_every"], lr_drops=tuple(a["lr_drops"]), lr_drop_factor=a["lr_drop_factor"],
        seed=a["seed"], max_replicas=a["max_replicas"], partitions=a["partitions"],
    )
    if not callable(model):
        raise ValueError("train: model must be a zero-argument callable that builds the nn.Module, e.g. functools.partial(gpu.MLP, 784, 10)")
    data = _as_data(data)
    task = _current_task()  # the dashboard links this run's curves to the branch(es) of this step
    overheads = {"admission_seconds": 0.0, "queued_seconds": 0.0, "data_seconds": 0.0, "tuning_seconds": 0.0}
    if workers == 1 or not _client_available():
        epochs = _observed(Solo(), data, model, cfg, None, task)
        try:
            rec = next(epochs)
            while True:
                yield _report(rec)
                rec = next(epochs)
        except StopIteration as end:
            out = end.value
        finally:
            epochs.close()
        return _summarise(out, model, cfg, 1, 0, overheads, time.perf_counter() - t_call)
    from .gang import gang_client

    with gang_client() as client:  # inside a task: seceded, so this thread can host a member
        gang = _GangRun(client, data, model, cfg, workers, a["max_restarts"], a["timeout"], task, overheads)
        try:
            yield from gang.reports()
        finally:
            gang.close()  # closed early: the members stop at their next epoch boundary
        out, size, restarts = gang.outcome()
    return _summarise(out, model, cfg, size, restarts, overheads, time.perf_counter() - t_call)


train.__quiver_iterative__ = True  # type: ignore[attr-defined]
train.__quiver_iterate__ = iterate  # type: ignore[attr-defined]


def _report(rec: dict) -> dict:
    """An epoch's report: its scalar entries, with ``loss`` naming the training loss."""
    out = _scalars(rec)
    out.setdefault("loss", out.get("train_loss"))
    return out


def pick_workers(alive: list[str], busy: Mapping[str, int], here: str | None, n: int | None) -> list[str] | None:
    """The workers a gang of ``n`` trains on (``None``: every worker): this task's own worker
    first (its thread is free: the task seceded), then the least busy, so that two gangs
    smaller than the cluster take different workers instead of queueing for the same ones.

    >>> pick_workers(["a", "b", "c", "d"], {"a": 1, "b": 0, "c": 2, "d": 0}, "c", 2)
    ['c', 'b']
    >>> pick_workers(["a", "b"], {}, None, 3), pick_workers(["a", "b"], {}, "a", None)
    (['a', 'b'], None)
    """
    if n is None:
        return None
    others = sorted((w for w in alive if w != here), key=lambda w: (busy.get(w, 0), w))
    order = ([here] if here in alive else []) + others
    return order[:n]


class _GangRun:
    """A gang training run driven from its step's task: the gang (with its restarts from the
    last checkpoint) runs on a helper thread; its epochs come back from rank 0 through a
    ``distributed.Queue``; ``close`` sets the run's stop event and waits for the members."""

    def __init__(self, client, data, model, cfg: TrainConfig, workers, max_restarts, timeout, task, overheads):
        import threading

        from distributed import Event

        self.client, self.data, self.model, self.cfg = client, data, model, cfg
        self.workers, self.max_restarts, self.timeout = workers, max_restarts, timeout
        self.task, self.overheads = task, overheads
        self.run = f"quiver-train-{uuid.uuid4().hex[:12]}"
        self.stop_event = Event(f"{self.run}-stop", client=client)
        self.restarts, self.failures = 0, []
        self.here = _worker_address() if task is not None else None  # asked from the step's thread
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"{self.run}-gang", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.value = self._train()
        except BaseException as exc:  # raised again in the step's thread
            self.error = exc

    def reports(self):
        from distributed import Queue

        queue = Queue(f"{self.run}-epochs", client=self.client)
        try:
            yield from self._drain_queue(queue)
        finally:
            queue.close()

    def _drain_queue(self, queue):
        last, pause = 0, 0.01
        while True:
            finished = not self.thread.is_alive()
            got = queue.get(batch=True)  # non-blocking: a blocking get logs scheduler errors
            for rec in got:
                if rec["epoch"] > last:  # a restart replays epochs since its checkpoint
                    last = rec["epoch"]
                    yield _report(rec)
            if finished and not got:
                break
            if not got:
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
            else:
                pause = 0.01

    def close(self) -> None:
        if self.thread.is_alive():
            self.stop_event.set()
            self.thread.join()
        try:
            self.stop_event.clear()
        except Exception as exc:  # recorded: the cluster may be going away; nothing waits for it
            logger.debug("quiver: cannot clear the gang's stop event: %s", exc)

    def outcome(self) -> tuple[dict, int, int]:
        if self.error is not None:
            raise self.error
        results = self.value
        out = results[0]
        out["restart_errors"] = self.failures
        return out, len(results), self.restarts

    def _train(self) -> list:
        from distributed import Event, Variable

        from .gang import GangError, run_gang_timed

        client, cfg, model, data, overheads = self.client, self.cfg, self.model, self.data, self.overheads
        task, timeout = self.task, self.timeout
        # Named after the step's task key when inside Dask: if the worker running this step dies,
        # Dask reruns the step elsewhere and the rerun resumes from the last checkpoint.
        name = f"quiver-checkpoint-{task or uuid.uuid4().hex[:12]}"
        started = Event(f"{name}-started", client=client)  # set once the checkpoint variable exists
        resume = _last_checkpoint(name, client) if started.is_set() else None
        if resume is not None:
            self.restarts += 1
            self.failures.append("the worker running this training step was lost; the step's rerun resumed from the last checkpoint")
        if not started.is_set():
            Variable(name, client=client).set(b"")
            started.set()
        tuned = None
        while True:
            alive = sorted(client.scheduler_info(n_workers=-1)["workers"])
            busy = {w: len(keys) for w, keys in client.processing().items()} if self.workers else {}
            pool = pick_workers(alive, busy, self.here, self.workers)
            # the data set goes to the gang's workers once (as one key), not inside every member task
            t0 = time.perf_counter()
            shipped = client.scatter(data, workers=pool or alive, broadcast=True, hash=False)
            overheads["data_seconds"] += time.perf_counter() - t0
            try:
                if cfg.replicas == "auto" and resume is None and tuned is None:
                    tuned = _auto_replicas(client, shipped, data, model, cfg, pool, len(pool or alive),
                                           task, timeout, overheads)
                member = functools.partial(_train_member, model=model, cfg=cfg, resume=resume,
                                           checkpoint_name=name, task=task, tuned=tuned, run=self.run)
                results, timings = run_gang_timed(client, member, pool, shipped, timeout=timeout)
                _count(overheads, timings)
                break
            except GangError as exc:
                self.restarts += 1
                self.failures.append(str(exc))
                if self.restarts > self.max_restarts:
                    _forget(name, client)
                    raise RuntimeError(
                        f"train: gave up after {self.max_restarts} restart(s); last failure: {exc}"
                    ) from exc
                resume = _last_checkpoint(name, client) or resume
            finally:
                del shipped
        _forget(name, client)
        return results


def _worker_address() -> str | None:
    from .worker import current_worker

    worker = current_worker()
    return None if worker is None else worker.address


def _replicas_memo_key(model: Callable, data: Any, cfg: TrainConfig, size: int) -> list[str] | None:
    """Where the scheduler remembers a tuned replica count: everything the tuner's choice depends on
    (the model, the data's shapes, batch size, sync period, tuner settings, the number of workers),
    and nothing it does not (learning rate, epochs, seed...). ``None`` when the model has no
    deterministic token (then every run tunes)."""
    return memo_key("replicas-auto", model, data, cfg.batch_size, cfg.sync_every, cfg.max_replicas,
                    cfg.tune_threshold, cfg.tune_steps, cfg.partitions, cfg.algorithm, size)


def memo_key(kind: str, model: Callable, data: Any, *settings: Any) -> list[str] | None:
    """The scheduler metadata key (``["quiver", kind, token]``) a tuned choice is remembered under:
    a token of the model, ``settings`` and the data's fingerprint (train shape, dtype, device and
    test length: what a tuned count depends on, not the values). ``None`` when the model has no
    deterministic token (then every run tunes). The one owner of that fingerprint: a tuned
    replica count (``gpu.train``) and a packed task's member count (``gpu.packing``) use it.

    >>> import functools, torch, gpu
    >>> data = gpu.DataSplit(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long), torch.zeros(2, 4),
    ...                      torch.zeros(2, dtype=torch.long))
    >>> mlp = functools.partial(gpu.MLP, 4, 2)
    >>> memo_key("k", mlp, data, 4) == memo_key("k", mlp, data, 4) != memo_key("k", mlp, data, 8)
    True
    >>> memo_key("k", object(), data, 4) is None          # no deterministic token: nothing remembered
    True
    """
    import dask
    from dask.base import tokenize
    from dask.tokenize import TokenizationError

    fingerprint = (tuple(data.x_train.shape), str(data.x_train.dtype), str(data.x_train.device), len(data.x_test))
    try:
        with dask.config.set({"tokenize.ensure-deterministic": True}):
            token = tokenize(model, *settings, fingerprint)
    except TokenizationError:
        return None
    return ["quiver", kind, token]


def _count(overheads: dict, timings: dict) -> None:
    """Add a gang's timings: waiting for other gangs (their admission, their workers) apart from
    this gang's own admission."""
    queued = timings["lock_s"] + timings.get("wait_s", 0.0)
    overheads["queued_seconds"] += queued
    overheads["admission_seconds"] += max(timings["admission_s"] - queued, 0.0)


def _auto_replicas(client, shipped, data, model, cfg: TrainConfig, pool, size: int, task, timeout,
                   overheads: dict) -> dict:
    """The replica count for ``replicas="auto"``: remembered by the scheduler from an earlier
    tuning of the same model, data shapes, batch and workers, else tuned now by a gang of its own
    and remembered. A lock per memo key makes concurrent runs wait for one tuning and share it."""
    from distributed import Lock

    from .gang import run_gang_timed

    def tune() -> dict:
        t0 = time.perf_counter()
        results, timings = run_gang_timed(client, functools.partial(_tune, model=model, cfg=cfg, task=task),
                                          pool, shipped, timeout=timeout)
        _count(overheads, timings)
        overheads["tuning_seconds"] += time.perf_counter() - t0 - timings["admission_s"]
        return results[0]

    key = _replicas_memo_key(model, data, cfg, size)
    if key is None:
        return tune()
    lock = Lock(f"quiver-replicas-{key[-1]}", scheduler_rpc=client.scheduler, loop=client.loop)
    t0 = time.perf_counter()
    lock.acquire()
    overheads["queued_seconds"] += time.perf_counter() - t0
    try:
        memo = client.get_metadata(key, default=None)
        if memo is not None:
            return {**memo, "source": "remembered", "tuning_samples": 0}
        tuned = tune()
        client.set_metadata(key, {"replicas": tuned["replicas"], "tuning": [list(p) for p in tuned["tuning"]],
                                  "step_compute": tuned["step_compute"]})
        return tuned
    finally:
        lock.release()


def _forget(name: str, client=None) -> None:
    try:
        from distributed import Event, Variable

        Variable(name, client=client).delete()
        Event(f"{name}-started", client=client).clear()
    except Exception as exc:  # recorded: the cluster may be going away; nothing waits for them
        logger.debug("quiver: cannot forget %s: %s", name, exc)


def _summarise(out: dict, model: Callable, cfg: TrainConfig, size: int, restarts: int,
               overheads: dict | None = None, wall: float | None = None) -> dict:
    import torch

    overheads = overheads or {}

    from .replicas import ParamLayout

    torch.manual_seed(cfg.seed)
    net = model()
    with torch.no_grad():
        ParamLayout(net).load(net, out["z"])
    history = out["history"]
    last = history[-1] if history else {}
    reached = next((h for h in history if cfg.target_accuracy is not None and h["accuracy"] >= cfg.target_accuracy), None)
    timings = out.get("timings", {})
    training = float(sum(h.get("train_s", 0.0) for h in history))
    lead = float(overheads.get("tuning_seconds", 0.0))
    result = {
        "model": net,
        "accuracy": last.get("accuracy", float("nan")),
        "test_loss": last.get("test_loss", float("nan")),
        "train_loss": last.get("train_loss", float("nan")),
        "history": history,
        "epochs": len(history),
        # from the first data touch: a tuning gang run for this call (before the training gang) counts
        "seconds": last.get("elapsed_s", 0.0) + lead,
        "epochs_to_target": reached["epoch"] if reached else None,
        "seconds_to_target": reached["elapsed_s"] + lead if reached else None,
        "replicas": out["replicas"],
        "replicas_source": out.get("replicas_source", "given"),
        "samples_per_s": float(sum(h["samples_per_s"] for h in history) / max(len(history), 1)),
        "tuning": out["tuning"],
        "partitions": out.get("partitions", 1),
        "sync_tuning": out.get("sync_tuning", {}),
        "workers": size,
        "restarts": restarts,
        "restart_errors": out.get("restart_errors", []),
        "tuning_samples": out.get("tuning_samples", 0),
        "algorithm": cfg.algorithm,
        # where a branch's time went (seconds): the epochs' training loops, and everything else
        "training_seconds": training,
        "tuning_seconds": float(timings.get("tuning_s", 0.0) + timings.get("partitions_s", 0.0)
                                + overheads.get("tuning_seconds", 0.0)),
        "admission_seconds": float(overheads.get("admission_seconds", 0.0)),
        "queued_seconds": float(overheads.get("queued_seconds", 0.0)),
        "data_seconds": float(overheads.get("data_seconds", 0.0)),
    }
    if wall is not None:
        result["wall_seconds"] = wall
        # what the branch cost besides its training loops and waiting for other branches' gangs
        result["overhead_seconds"] = max(wall - training - result["queued_seconds"], 0.0)
    return result
