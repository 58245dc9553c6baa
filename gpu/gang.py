"""Gangs: one long-running task per worker, started together, wired with a :class:`Collective`.

:func:`run_gang` runs ``fn(ctx, *args, **kwargs)`` once on each of the given workers (rank =
position in ``workers``) and returns the results in rank order. ``ctx`` is a
:class:`GangContext`: ``rank``, ``size``, ``worker`` (this member's worker address), ``workers``,
``name``, and ``collective``, already connected to every other member.

Admission is atomic, so gangs never deadlock each other. Two gangs that each got one of two
1-thread workers would wait forever for the other's worker. Here the client holds a
cluster-wide ``distributed.Lock("quiver-gang-admission")`` from submitting the members until
*every* member is running and has checked in (a ``distributed.Queue`` on the scheduler);
only then are the peers' addresses published (a ``distributed.Variable``) and the lock
released. At most one gang is ever partially started, and it only waits for workers busy
with fully started gangs (which finish) or ordinary tasks, so every gang makes progress.
A gang that must wait for busy workers keeps the lock, so other gangs queue behind it.

Failures are bounded and named: a member that raises aborts its collective (every other
member's next or current collective raises :class:`~gpu.allreduce.CollectiveError` at once),
a member whose worker dies is noticed through the closed connections and the scheduler, and
:func:`run_gang` raises :class:`GangError` with the failing rank, its worker and exception.

Called from inside a Dask task (a pipeline step that trains), :func:`run_gang` uses the
worker's client and secedes the calling task from the thread pool (:func:`gang_client`), so its
thread can host a member. Nested gangs (``fn`` calling ``run_gang``) are untested.

>>> def total(ctx, n):
...     import torch
...     t = torch.full((n,), float(ctx.rank + 1))
...     return ctx.collective.allreduce_(t).tolist()
>>> client = distributed.Client(n_workers=2, threads_per_worker=1)   # doctest: +SKIP
>>> run_gang(client, total, None, 3)                                 # doctest: +SKIP
[[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from gpu.allreduce import Collective, CollectiveError

__all__ = ["GangContext", "GangError", "run_gang", "run_gang_timed", "gang_client", "ADMISSION_LOCK"]

logger = logging.getLogger(__name__)

ADMISSION_LOCK = "quiver-gang-admission"
_POLL_SECONDS = 0.25


class GangError(RuntimeError):
    """A gang failed: ``rank`` (the member blamed), ``worker`` (its address), ``exception``
    (its error), and ``errors`` (every member's error, by rank).

    >>> e = GangError("gang g: rank 1 failed", rank=1, worker="tcp://h:1", exception=ValueError("x"))
    >>> e.rank, type(e.exception).__name__
    (1, 'ValueError')
    """

    def __init__(self, message: str, *, rank: int | None = None, worker: str | None = None,
                 exception: BaseException | None = None,
                 errors: dict[int, BaseException] | None = None) -> None:
        super().__init__(message)
        self.rank, self.worker, self.exception = rank, worker, exception
        self.errors = dict(errors or {})

    def __reduce__(self):
        return (_rebuild_gang_error, (str(self), self.rank, self.worker, self.exception, self.errors))


def _rebuild_gang_error(message, rank, worker, exception, errors):
    return GangError(message, rank=rank, worker=worker, exception=exception, errors=errors)


@dataclass
class GangContext:
    """What a member function receives: its place in the gang and a connected collective.

    >>> ctx = GangContext(rank=0, size=1, worker="tcp://h:1", workers=("tcp://h:1",),
    ...                   name="g", collective=Collective(0, 1))
    >>> ctx.rank, ctx.size, ctx.collective.size
    (0, 1, 1)
    """

    rank: int
    size: int
    worker: str
    workers: tuple[str, ...]
    name: str
    collective: Collective


# ----------------------------------------------------------------------------- member side


def _member(name: str, rank: int, workers: tuple[str, ...], fn: Callable, args: tuple,
            kwargs: dict, timeout: float, admission_timeout: float | None, algorithm: str) -> Any:
    """The task each member runs: listen, check in, wait for the peers, connect, call ``fn``."""
    from distributed import Event, Queue, Variable

    from .worker import current_worker, task_cancelled, task_client

    began = time.perf_counter()
    worker = current_worker()
    if worker is None:
        raise RuntimeError(f"gang {name!r} rank {rank}: a gang member runs as a Dask task, not called directly")
    size = len(workers)
    coll = Collective(rank, size, timeout=timeout, group=name, algorithm=algorithm, worker=worker)
    try:
        client = task_client(lambda: False)  # waits while a fault leaves the worker's client connecting
        checkin = Queue(f"{name}-checkin", client=client)
        # how long this member took from starting to checking in: the client subtracts it from
        # the check-in's arrival to tell when the member started (no clocks compared)
        checkin.put((rank, coll.address or "", time.perf_counter() - began), timeout=timeout)
        checkin.close()
        started = Event(f"{name}-start", client=client)
        deadline = None if admission_timeout is None else time.monotonic() + admission_timeout
        while not started.wait(timeout=_POLL_SECONDS * 4):  # no scheduler-side timeout errors
            if deadline is not None and time.monotonic() > deadline:
                raise GangError(f"gang {name}: rank {rank} waited {admission_timeout:g} s for "
                                "the other members to start", rank=rank, worker=worker.address)
            if task_cancelled():  # its client left, or the run cancelled it
                raise GangError(f"gang {name}: rank {rank} was cancelled before the gang started",
                                rank=rank, worker=worker.address)
        try:
            go = Variable(f"{name}-peers", client=client).get(timeout=timeout)  # set before the event
        except TimeoutError:
            raise GangError(f"gang {name}: called off before rank {rank} could connect",
                            rank=rank, worker=worker.address) from None
        if "abort" in go:
            raise GangError(f"gang {name}: admission aborted: {go['abort']}", rank=rank,
                            worker=worker.address)
        coll.connect(go["addresses"])
        ctx = GangContext(rank, size, worker.address, tuple(workers), name, coll)
        try:
            return fn(ctx, *args, **kwargs)
        except CollectiveError:
            raise
        except BaseException as e:  # re-raised: the peers are told first, so they fail at once
            coll.abort(f"member function raised {e!r}")
            raise
    finally:
        coll.close()


# ----------------------------------------------------------------------------- client side


def run_gang(client: Any, fn: Callable, workers: Sequence[str] | None = None, *args: Any,
             timeout: float = 60.0, admission_timeout: float | None = None,
             algorithm: str = "auto", priority: int = 0, **kwargs: Any) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` as a gang, one member per worker; results by rank.

    ``client``: a ``distributed.Client`` (``None``: the current one; inside a task, the
    worker's client is used either way, see :func:`gang_client`). ``workers``: worker addresses in rank order
    (``None``: every worker, sorted). ``timeout`` bounds every collective wait (seconds);
    ``admission_timeout`` bounds the wait for the lock and for the members to start
    (``None``: wait while the workers are alive: a gang may queue behind long trainings).
    ``algorithm`` is the all-reduce algorithm (``"auto"``, ``"ring"`` or ``"tree"``).
    ``priority`` is the members' Dask task priority (a depth-first plan may rank training
    branches; atomic admission is what keeps differently ranked gangs from deadlocking).
    Keyword arguments with these names are taken by ``run_gang``: give ``fn`` such
    arguments with ``functools.partial``. Futures among ``args`` and ``kwargs`` reach ``fn``
    as their values (each member's worker fetches them once, from wherever they are).

    Raises :class:`GangError` naming the failing rank when a member fails or its worker dies.

    >>> run_gang(client, train, ["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001"], data,
    ...          lr=0.1, timeout=30.0)                                  # doctest: +SKIP
    [{'loss': 0.12}, {'loss': 0.12}]
    """
    return run_gang_timed(client, fn, workers, *args, timeout=timeout,
                          admission_timeout=admission_timeout, algorithm=algorithm,
                          priority=priority, **kwargs)[0]


def run_gang_timed(client: Any, fn: Callable, workers: Sequence[str] | None = None, *args: Any,
                   timeout: float = 60.0, admission_timeout: float | None = None,
                   algorithm: str = "auto", priority: int = 0,
                   **kwargs: Any) -> tuple[list[Any], dict[str, float]]:
    """:func:`run_gang`, also returning where the time went: ``lock_s`` (waiting for the
    admission lock), ``wait_s`` (then until the last member started: its worker was busy, e.g.
    with another gang), ``admission_s`` (from asking for the lock until every member had checked
    in, both included), ``run_s`` (from then until the results were back).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with gang_client(client) as c:
        return _run(c, fn, workers, args, kwargs, timeout, admission_timeout, algorithm, priority)


_state = threading.local()


@contextlib.contextmanager
def gang_client(client: Any = None):
    """The client gangs are launched with: inside a Dask task, the worker's client, the task
    having seceded from the worker's thread pool (so its thread can host a member) for good,
    else ``client`` or the current one. The task never rejoins the pool: rejoining waits for a
    free thread, and on a worker whose one thread now runs another gang's member that wait
    lasts that gang's whole training (seen as seconds of overhead per branch).

    >>> with gang_client() as c:                                     # doctest: +SKIP
    ...     future = c.scatter(data, broadcast=True)
    ...     run_gang(c, member, None, future)
    """
    held = getattr(_state, "client", None)
    if held is not None:
        yield held
        return
    if _inside_task():
        from distributed import secede

        from .worker import task_client

        wc = task_client(lambda: False)
        try:
            secede()
        except KeyError:  # seceded already (an earlier gang in this task)
            pass
        _state.client = wc
        try:
            yield wc
        finally:
            _state.client = None
        return
    if client is None:
        from distributed import get_client

        client = get_client()
    yield client


def _inside_task() -> bool:
    from .worker import current_task

    return current_task() is not None


def _alive_workers(client) -> set[str]:
    # ask directly: scheduler_info() returns a cache that a periodic refresh overwrites
    # with an empty worker list
    return set(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def _run(client, fn, workers, args, kwargs, timeout, admission_timeout, algorithm,
         priority) -> tuple[list[Any], dict[str, float]]:
    from distributed import Event, Lock, Queue, Variable

    alive = _alive_workers(client)
    if workers is None:
        workers = sorted(alive)
    workers = tuple(workers)
    if not workers:
        raise ValueError("no workers: the cluster has none, or workers=[] was given")
    if len(set(workers)) != len(workers):
        raise ValueError(f"workers must be distinct (one member per worker), got {list(workers)}")
    unknown = [w for w in workers if w not in alive]
    if unknown:
        raise ValueError(f"unknown workers {unknown}; the cluster has {sorted(alive)}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if admission_timeout is not None and not admission_timeout > 0:
        raise ValueError(f"admission_timeout must be positive seconds or None, got {admission_timeout!r}")

    name = f"quiver-gang-{uuid.uuid4().hex[:12]}"
    checkin = Queue(f"{name}-checkin", client=client)
    peers = Variable(f"{name}-peers", client=client)
    started = Event(f"{name}-start", client=client)
    lock = Lock(ADMISSION_LOCK, scheduler_rpc=client.scheduler, loop=client.loop)
    deadline = None if admission_timeout is None else time.monotonic() + admission_timeout
    futures: list = []
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        if not lock.acquire(timeout=admission_timeout):
            raise GangError(f"gang {name}: another gang held the admission lock for more than "
                            f"admission_timeout={admission_timeout:g} s")
        timings["lock_s"] = time.perf_counter() - t0
        try:
            futures = [
                client.submit(_member, name, rank, workers, fn, args, kwargs, timeout,
                              admission_timeout, algorithm, key=f"{name}-rank-{rank}",
                              workers=[address], allow_other_workers=False, pure=False,
                              priority=priority)
                for rank, address in enumerate(workers)
            ]
            addresses, last_start = _admit(client, name, workers, futures, checkin, deadline)
            # waiting for busy workers to start the members (e.g. another gang's training) is queueing
            timings["wait_s"] = max(last_start - t0 - timings["lock_s"], 0.0)
            peers.set({"addresses": addresses})
            started.set()
        except BaseException as e:  # re-raised: the members waiting for their peers are told first
            peers.set({"abort": repr(e)})
            started.set()
            raise
        finally:
            lock.release()
        timings["admission_s"] = time.perf_counter() - t0
        results = _gather(client, name, workers, futures, timeout)
        timings["run_s"] = time.perf_counter() - t0 - timings["admission_s"]
        return results, timings
    except BaseException:  # re-raised: the members submitted are cancelled first
        if futures:
            client.cancel(futures)
        raise
    finally:
        checkin.close()
        for cleanup in (peers.delete, started.clear):
            try:
                cleanup()
            except Exception as exc:  # recorded: the cluster may be going away; nothing waits for them
                logger.debug("gang %s: clean-up failed: %s", name, exc)


def _admit(client, name, workers, futures, checkin, deadline) -> tuple[list[str], float]:
    """Wait (holding the lock) until every member has checked in with its listener address;
    return the addresses and when (``perf_counter``, estimated) the last member started."""
    addresses: list[str | None] = [None] * len(workers)
    last_start = 0.0
    pause = 0.01
    while any(a is None for a in addresses):
        arrived = checkin.get(batch=True)  # what is there now; blocking gets log scheduler errors
        now = time.perf_counter()
        for rank, address, took in arrived:
            addresses[rank] = address
            last_start = max(last_start, now - took)
        if arrived:
            pause = 0.01
            continue
        time.sleep(pause)
        pause = min(pause * 2, _POLL_SECONDS)
        for rank, f in enumerate(futures):
            if f.status == "error":
                raise _member_error(name, workers, {rank: f.exception()}, started=False)
        gone = [r for r, w in enumerate(workers) if addresses[r] is None and w not in _alive_workers(client)]
        if gone:
            raise GangError(f"gang {name}: worker {workers[gone[0]]} (rank {gone[0]}) left the "
                            "cluster before its member started", rank=gone[0], worker=workers[gone[0]])
        if deadline is not None and time.monotonic() > deadline:
            waiting = [r for r, a in enumerate(addresses) if a is None]
            raise GangError(f"gang {name}: ranks {waiting} did not start within admission_timeout "
                            f"(workers {[workers[r] for r in waiting]} busy?)", rank=waiting[0],
                            worker=workers[waiting[0]])
    return addresses, last_start  # type: ignore[return-value]


def _gather(client, name, workers, futures, timeout) -> list[Any]:
    """Wait for the members; on the first failure, give the rest a bounded grace, then blame."""
    from distributed import wait

    dead: dict[int, BaseException] = {}

    def note_dead() -> None:
        alive = _alive_workers(client)
        for rank, f in enumerate(futures):
            if f.status == "pending" and workers[rank] not in alive and rank not in dead:
                dead[rank] = GangError(f"worker {workers[rank]} died or left the cluster while "
                                       f"running rank {rank}", rank=rank, worker=workers[rank])

    while True:
        pending = [f for f in futures if f.status == "pending"]
        try:
            if pending:
                wait(pending, timeout=1.0, return_when="FIRST_COMPLETED")
        except TimeoutError:
            pass
        if all(f.status == "finished" for f in futures):
            return client.gather(futures)
        note_dead()
        if dead or any(f.status in ("error", "cancelled") for f in futures):
            break
    # the others notice within `timeout` (usually at once: the failed member aborted)
    grace = time.monotonic() + timeout + 5.0
    while time.monotonic() < grace:
        pending = [f for r, f in enumerate(futures) if f.status == "pending" and r not in dead]
        if not pending:
            break
        try:
            wait(pending, timeout=0.5)
        except TimeoutError:
            pass
        note_dead()
    errors = dict(dead)
    for rank, f in enumerate(futures):
        if rank in errors:
            continue
        if f.status == "error":
            errors[rank] = f.exception()
        elif f.status == "cancelled":
            errors[rank] = GangError(f"rank {rank} was cancelled", rank=rank, worker=workers[rank])
    client.cancel([f for f in futures if f.status == "pending"])
    raise _member_error(name, workers, errors, started=True)


def _member_error(name, workers, errors: dict[int, BaseException], started: bool) -> GangError:
    """Blame one rank: a dead worker, else a member's own error, else whom the collectives blame."""
    def is_collective(e):
        return isinstance(e, CollectiveError) or (
            isinstance(e, GangError) and isinstance(e.exception, CollectiveError))

    own = {r: e for r, e in errors.items() if not is_collective(e)}
    if own:
        rank = min(own)
        exc = own[rank]
    else:  # only collective errors: blame the peer most of them name, with a witness's words
        blamed = [e.peer for e in errors.values() if isinstance(e, CollectiveError) and e.peer is not None]
        rank = max(sorted(set(blamed)), key=blamed.count) if blamed else min(errors)
        witnesses = [e for r, e in sorted(errors.items())
                     if r != rank and isinstance(e, CollectiveError) and e.peer == rank]
        exc = witnesses[0] if witnesses else errors.get(rank, errors[min(errors)])
    phase = "" if started else " before the gang started"
    return GangError(f"gang {name}: rank {rank} on {workers[rank]} failed{phase}: {exc!r}",
                     rank=rank, worker=workers[rank], exception=exc, errors=errors)
