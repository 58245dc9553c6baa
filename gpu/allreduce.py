"""Worker-to-worker collectives (all-reduce, broadcast, barrier) over ``distributed.comm``.

For use from *inside* a long-running Dask task, one per participating worker (a gang, see
:mod:`gpu.gang`); there is no parameter server. Each member opens a listener on its worker's
own protocol and host (``tcp://`` or ``ucxx://``: whatever ``get_worker().address`` uses),
publishes the listener's address through a rendezvous, then connects to every other member
(a full mesh of ``size·(size−1)/2`` comms, so a failure anywhere is seen by everyone at once).
The async comm code runs on the worker's event loop; the task thread drives it through
``distributed.utils.sync``. A background reader per peer queues incoming messages, so an
``abort`` from a failing peer, or a dropped connection, is noticed even while this member
waits on someone else.

Algorithms: ``"ring"`` (reduce-scatter then all-gather: ``2(p−1)`` steps of ``n/p``
elements, both directions of every link busy, bandwidth-optimal) and ``"tree"`` (binomial
reduce to rank 0, then binomial broadcast: ``2⌈log₂p⌉`` steps of ``n`` elements, fewer
messages). Which chunk goes to which rank at which step is decided by the pure schedules of
:mod:`gpu.schedules` (tested over in-memory ranks); this module only connects the ranks and
executes a schedule's rounds (:meth:`Collective._execute`). ``"auto"`` (the default) takes the tree below :data:`CROSSOVER_BYTES` (64 KiB)
and the ring from there. ``benchmarks/allreduce.py``, timing the *slower* rank of each call
against gloo in the same two worker processes, measured the ring faster than the tree at
every size from 1 MB to 64 MB over loopback ``tcp://`` (64 MB: 58 ms vs 75 ms), and the two
within noise over ``ucxx://`` on CPU; below 64 KiB both are latency-bound and the tree takes
fewer steps from 4 ranks on. (An earlier per-rank-average measurement that favoured the tree
over TCP was an artefact of sends returning before their data had left.) On other hardware
call :func:`choose_algorithm`, which times both at the model's size and keeps the faster.
Both give bit-identical results on every rank, which SMA needs: every worker applies the
same ``Δ`` to its copy of the central model.

Data paths: CPU tensors cross as numpy arrays (``to_serialize``: the "dask" serializer sends
them as raw frames, no pickling copies). CUDA tensors, when ``cupy`` is importable, cross as
cupy arrays made with DLPack (zero copy); over ``ucxx://`` distributed's "cuda" serializer
sends them as device buffers. CUDA tensors without cupy are staged through host memory.

Every wait is bounded by ``timeout`` (seconds, default 60): a peer that dies, stalls or
fails gives every member a :class:`CollectiveError` naming the peer and the timeout, and the
first member to fail tells the others (``abort``), so nobody waits out a second timeout.

A group of one needs no worker or network (the collectives are identities):

>>> import torch
>>> c = Collective(rank=0, size=1)
>>> c.allreduce_(torch.ones(3))
tensor([1., 1., 1.])
>>> c.barrier(); c.close()

Across workers (inside one task per worker; :func:`gpu.gang.run_gang` does the wiring)::

    c = Collective(rank, size, timeout=60.0, group="my-gang")   # opens the listener
    publish(rank, c.address); c.connect(addresses_by_rank)      # rendezvous
    c.allreduce_(t)                 # t ← Σ over ranks, in place
    c.broadcast_(t, root=0); c.barrier()
    measure_bandwidth(c, [2**10, 2**20]).bandwidth              # bytes/s, for the sync tuner
    c.close()
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from .schedules import allreduce_schedule, broadcast as broadcast_schedule, rank_plan

logger = logging.getLogger(__name__)

__all__ = [
    "CollectiveError",
    "Collective",
    "BandwidthSample",
    "BandwidthProfile",
    "measure_bandwidth",
    "fit_latency_bandwidth",
    "choose_algorithm",
    "ALGORITHMS",
    "CROSSOVER_BYTES",
]

ALGORITHMS = ("auto", "ring", "tree")
# Where "auto" switches from tree to ring, by protocol (see the module docstring).
CROSSOVER_BYTES: dict[str, float] = {"ucx": 64 << 10, "tcp": 64 << 10}
_SERIALIZERS = ("cuda", "dask", "pickle", "error")  # UCX: cupy arrays go as device frames
_HOST_SERIALIZERS = ("dask", "pickle", "error")  # TCP: cupy's "dask" serializer stages to host
_ABORT_SEND_SECONDS = 1.0


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer died, stalled, failed or misbehaved.

    ``rank`` is the member that raised, ``peer`` the member blamed (or ``None``), and
    ``timeout`` the bound (seconds) that applied.

    >>> e = CollectiveError("rank 0: timed out", rank=0, peer=1, timeout=3.0)
    >>> e.peer, e.timeout, str(e)
    (1, 3.0, 'rank 0: timed out')
    >>> import pickle; pickle.loads(pickle.dumps(e)).peer
    1
    """

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.timeout = timeout

    def __reduce__(self):
        return (_rebuild_error, (type(self), str(self), self.rank, self.peer, self.timeout))


def _rebuild_error(cls, message, rank, peer, timeout):
    return cls(message, rank=rank, peer=peer, timeout=timeout)


class _Closed:
    """Queue sentinel: no more messages will come from this peer."""

    def __init__(self, error: CollectiveError) -> None:
        self.error = error


# ----------------------------------------------------------------------------- buffers


class _Buffer:
    """A flat, contiguous view of a tensor as a numpy or cupy array, written back on finish."""

    def __init__(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor
        self.device = None  # cupy device id when the data stays on the GPU
        t = tensor.detach()
        if t.is_cuda:  # the producer's kernels must be done before the comm reads the memory
            torch.cuda.current_stream(t.device).synchronize()
        cupy = _cupy() if t.is_cuda else None
        staged = not t.is_contiguous() or t.dtype == torch.bfloat16
        if t.dtype == torch.bfloat16:  # neither numpy nor cupy has bfloat16: sum in float32
            t = t.float()
        if cupy is not None:  # stays on the device: a DLPack view (zero copy)
            self.device = t.device.index or 0
            self.work = t.contiguous()
            with cupy.cuda.Device(self.device):
                self.array = cupy.from_dlpack(self.work).reshape(-1)
        else:  # host: a view of the tensor's own memory, or a host copy of a CUDA tensor
            staged = staged or t.is_cuda
            self.work = t.cpu().contiguous()
            self.array = self.work.numpy().reshape(-1)
        self.staged = staged

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def add_(self, a: int, b: int, other: Any) -> None:
        if self.device is not None:
            with _cupy().cuda.Device(self.device):
                self.array[a:b] += other
        else:
            self.array[a:b] += other

    def set_(self, a: int, b: int, other: Any) -> None:
        if self.device is not None:
            with _cupy().cuda.Device(self.device):
                self.array[a:b] = other
        else:
            self.array[a:b] = other

    def sync(self) -> None:
        """Wait for the device work queued on the buffer (the adds run on the loop thread)."""
        if self.device is not None:
            _cupy().cuda.Device(self.device).synchronize()

    def finish(self) -> torch.Tensor:
        """Copy the result back into the caller's tensor when a staging copy was used."""
        if self.staged:
            with torch.no_grad():
                self.tensor.copy_(self.work.reshape(self.tensor.shape))
        return self.tensor


def _cupy():
    try:
        import cupy
    except Exception as exc:  # recorded: not installed, or no usable CUDA runtime (any error of its import)
        logger.debug("cupy unavailable: %s", exc)
        return None
    return cupy


# ----------------------------------------------------------------------------- collective


class Collective:
    """One member of a group of ``size`` ranks; collectives are called by every rank in order.

    Parameters: ``rank`` in ``[0, size)``; ``timeout`` bounds every wait (seconds);
    ``group`` names the group (connections carrying another name are refused);
    ``algorithm`` is ``"auto"``, ``"ring"`` or ``"tree"`` for :meth:`allreduce_`, with
    ``crossover_bytes`` the size from which ``"auto"`` takes the ring (``None``: the
    protocol's measured default, :data:`CROSSOVER_BYTES`); messages carry at
    most ``segment_bytes`` each (the receiver adds one while the next arrives); ``worker``
    defaults to ``distributed.get_worker()`` (needed when ``size > 1``).

    Counters for bandwidth measurement: ``bytes_sent``, ``bytes_received`` (payload
    bytes), ``seconds`` (wall time spent inside collectives) and ``calls``.

    >>> c = Collective(0, 1, timeout=5.0)
    >>> c.rank, c.size, c.address is None, c.stats()["calls"]
    (0, 1, True, 0)
    """

    def __init__(self, rank: int, size: int, *, timeout: float = 60.0, group: str = "quiver",
                 algorithm: str = "auto", crossover_bytes: float | None = None,
                 segment_bytes: int = 64 << 20, worker: Any = None) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank must be an int in [0, {size}), got {rank!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if not isinstance(segment_bytes, int) or segment_bytes < 1:
            raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
        self.rank, self.size, self.timeout = rank, size, float(timeout)
        self.segment_bytes = segment_bytes
        self._crossover = crossover_bytes  # None: the measured default for the protocol
        self.group, self.algorithm = group, algorithm
        self.bytes_sent = self.bytes_received = 0
        self.seconds = 0.0
        self.calls = 0
        self.address: str | None = None
        self.protocol: str | None = None
        self.peers: list[str | None] = [None] * size
        self._seq = 0
        self._error: CollectiveError | None = None
        self._closed = False
        self._comms: dict[int, Any] = {}
        self._dirty: set[int] = set()  # peers whose comm had a write cancelled mid-way
        self._inbox: dict[int, asyncio.Queue] = {}
        self._byes: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task] = []
        self._listener = None
        self._worker = None
        if size == 1:
            return
        if worker is None:
            from .worker import current_worker

            worker = current_worker()
            if worker is None:
                raise CollectiveError(
                    f"rank {rank}: a Collective of size {size} must be created inside a Dask task "
                    "(it listens on the worker's own protocol and host); pass worker= otherwise",
                    rank=rank,
                )
        self._worker = worker
        self.address = self._sync(self._listen)

    # -- public API ------------------------------------------------------------------

    def connect(self, addresses: Sequence[str]) -> None:
        """Connect to every other rank, given every rank's :attr:`address` in rank order."""
        if self.size == 1:
            return
        addresses = list(addresses)
        if len(addresses) != self.size:
            raise ValueError(f"expected {self.size} addresses (one per rank), got {len(addresses)}")
        if addresses[self.rank] != self.address:
            raise ValueError(
                f"addresses[{self.rank}] is {addresses[self.rank]!r} but this rank listens on "
                f"{self.address!r}: pass the addresses in rank order"
            )
        self.peers = addresses
        self._sync(self._connect_all)

    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over all ranks, in place; returns ``tensor``. Same shape everywhere."""
        return self._run("allreduce", tensor, self._allreduce)

    def broadcast_(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` with ``root``'s tensor on every rank (binomial tree)."""
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in [0, {self.size}), got {root!r}")
        return self._run("broadcast", tensor, self._broadcast, root)

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        self._run("barrier", None, self._barrier)

    def abort(self, reason: str) -> None:
        """Tell every peer this rank gives up (they raise :class:`CollectiveError`), then close."""
        if self.size == 1 or self._closed:
            self._closed = True
            return
        err = CollectiveError(f"rank {self.rank}: {reason}", rank=self.rank, peer=self.rank,
                              timeout=self.timeout)
        try:
            self._sync(self._abort, err)
        finally:
            self._closed = True
            self._sync(self._shutdown)

    def close(self) -> None:
        """Say goodbye to the peers and close the comms and the listener (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.size > 1:
            self._sync(self._shutdown, True)

    def stats(self) -> dict[str, float]:
        """Counters: ``bytes_sent``, ``bytes_received``, ``seconds``, ``calls``."""
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "seconds": self.seconds, "calls": self.calls}

    def __enter__(self) -> "Collective":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Collective(rank={self.rank}, size={self.size}, address={self.address!r}, "
                f"algorithm={self.algorithm!r}, timeout={self.timeout:g})")

    # -- driving the event loop ------------------------------------------------------

    def _sync(self, coro_fn, *args):
        from distributed.utils import sync

        return sync(self._worker.loop, coro_fn, *args)

    def _run(self, kind: str, tensor: torch.Tensor | None, coro_fn, *args):
        if self._closed:
            raise CollectiveError(f"rank {self.rank}: the collective is closed", rank=self.rank)
        if self._error is not None:
            raise self._error
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{kind} expects a torch.Tensor, got {type(tensor).__name__}")
        self.calls += 1
        if self.size == 1:
            return tensor
        self._seq += 1
        start = time.perf_counter()
        try:
            buf = _Buffer(tensor) if tensor is not None else None
            self._sync(coro_fn, kind, self._seq, buf, *args)
            if buf is None:
                return None
            buf.sync()
            return buf.finish()
        finally:
            self.seconds += time.perf_counter() - start

    # -- connection set-up ------------------------------------------------------------

    async def _listen(self) -> str:
        from distributed.comm import listen
        from distributed.comm.addressing import parse_address, unparse_host_port, get_address_host

        protocol, _ = parse_address(self._worker.address)
        self.protocol = protocol
        self._serializers = _SERIALIZERS if protocol.startswith("ucx") else _HOST_SERIALIZERS
        if protocol == "inproc":
            where = "inproc://"
        else:
            where = f"{protocol}://{unparse_host_port(get_address_host(self._worker.address), 0)}"
        kwargs = self._worker.security.get_listen_args("worker")
        self._listener = listen(where, self._on_accept, **kwargs)
        await self._listener.start()
        return self._listener.contact_address

    async def _on_accept(self, comm) -> None:
        try:
            hello = await asyncio.wait_for(comm.read(), self.timeout)
            peer = hello.get("rank") if isinstance(hello, dict) else None
            if (not isinstance(hello, dict) or hello.get("op") != "hello"
                    or hello.get("group") != self.group or not isinstance(peer, int)
                    or not 0 <= peer < self.rank or peer in self._comms):
                await comm.close()
                return
            self._register(peer, comm)
            self._tasks.append(asyncio.current_task())  # this handler becomes peer's reader
            await asyncio.wait_for(comm.write({"op": "welcome", "rank": self.rank}), self.timeout)
            if self._connected is not None and len(self._comms) == self.size - 1:
                self._connected.set()
        except Exception as exc:  # recorded: a bad or broken handshake is refused; the rank waits for a good one
            logger.debug("rank %s: handshake refused: %r", self.rank, exc)
            comm.abort()
            return
        await self._read_loop(peer, comm)

    def _register(self, peer: int, comm) -> None:
        self._comms[peer] = comm
        self._inbox.setdefault(peer, asyncio.Queue())

    _connected: asyncio.Event | None = None

    async def _connect_all(self) -> None:
        from distributed.comm import connect

        self._connected = asyncio.Event()
        if len(self._comms) == self.size - 1:
            self._connected.set()
        kwargs = self._worker.security.get_connection_args("worker")

        async def one(peer: int) -> None:
            address = self.peers[peer]
            try:
                comm = await connect(address, timeout=self.timeout, **kwargs)
                await asyncio.wait_for(
                    comm.write({"op": "hello", "group": self.group, "rank": self.rank}), self.timeout)
                reply = await asyncio.wait_for(comm.read(), self.timeout)
            except Exception as e:  # re-raised as a CollectiveError naming the peer it could not reach
                raise CollectiveError(
                    f"rank {self.rank}: could not connect to rank {peer} at {address} within "
                    f"{self.timeout:g} s: {e!r}", rank=self.rank, peer=peer, timeout=self.timeout,
                ) from e
            if not (isinstance(reply, dict) and reply.get("op") == "welcome" and reply.get("rank") == peer):
                comm.abort()
                raise CollectiveError(
                    f"rank {self.rank}: {address} is not rank {peer} of group {self.group!r}",
                    rank=self.rank, peer=peer, timeout=self.timeout)
            self._register(peer, comm)
            self._tasks.append(asyncio.ensure_future(self._read_loop(peer, comm)))

        try:
            await asyncio.gather(*(one(p) for p in range(self.rank + 1, self.size)))
            if len(self._comms) == self.size - 1:
                self._connected.set()
            try:
                await asyncio.wait_for(self._connected.wait(), self.timeout)
            except asyncio.TimeoutError:
                missing = [p for p in range(self.rank) if p not in self._comms]
                raise CollectiveError(
                    f"rank {self.rank}: ranks {missing} did not connect within {self.timeout:g} s",
                    rank=self.rank, peer=missing[0], timeout=self.timeout) from None
        except CollectiveError as err:
            await self._abort(err)
            raise

    # -- messages -----------------------------------------------------------------------

    async def _read_loop(self, peer: int, comm) -> None:
        queue = self._inbox[peer]
        try:
            while True:
                msg = await comm.read()
                op = msg.get("op") if isinstance(msg, dict) else None
                if op == "abort":
                    blame = msg.get("blame")
                    self._fail(CollectiveError(
                        f"rank {self.rank}: rank {peer} ({self.peers[peer]}) aborted the collective: "
                        f"{msg.get('reason')}",
                        rank=self.rank, peer=blame if isinstance(blame, int) else peer,
                        timeout=self.timeout))
                    return
                if op == "bye":
                    self._byes.setdefault(peer, asyncio.Event()).set()
                    queue.put_nowait(_Closed(CollectiveError(
                        f"rank {self.rank}: rank {peer} ({self.peers[peer]}) has closed its collective; "
                        "every rank must call the same collectives in the same order",
                        rank=self.rank, peer=peer, timeout=self.timeout)))
                    return
                queue.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # recorded as the collective's error (a cancellation propagates above)
            if not self._closed:
                self._fail(CollectiveError(
                    f"rank {self.rank}: lost the connection to rank {peer} ({self.peers[peer]}): {e!r}; "
                    "its worker may have died", rank=self.rank, peer=peer, timeout=self.timeout))
        finally:
            # a bye, or the connection gone: either way nothing more will come from this peer
            self._byes.setdefault(peer, asyncio.Event()).set()
            comm.abort()

    def _fail(self, err: CollectiveError) -> None:
        if self._error is None:
            self._error = err
        for queue in self._inbox.values():
            queue.put_nowait(_Closed(self._error))

    async def _send(self, peer: int, kind: str, seq: int, array: Any = None) -> None:
        from distributed.protocol import to_serialize

        if self._error is not None:
            raise self._error
        msg = {"op": "data", "kind": kind, "seq": seq}
        if array is not None:
            msg["n"] = int(array.size)
            # The frames point at `array`, which the algorithm (or the caller) overwrites right
            # after: TCP's comm.write returns once the frames are queued, so _send waits for
            # the stream to drain below; in-process comms hand the object itself over, so they
            # get a copy; UCX sends complete before write returns.
            inproc = not (self.protocol or "").startswith(("tcp", "tls", "ucx"))
            msg["data"] = to_serialize(array.copy() if inproc else array)
        comm = self._comms[peer]
        self._dirty.add(peer)
        try:
            await asyncio.wait_for(comm.write(msg, serializers=self._serializers), self.timeout)
            stream = getattr(comm, "stream", None)  # TCP: wait until the frames have left
            if array is not None and stream is not None and stream.writing():
                await asyncio.wait_for(stream.write(b""), self.timeout)
        except asyncio.TimeoutError:
            raise CollectiveError(
                f"rank {self.rank}: timed out after {self.timeout:g} s sending {kind} #{seq} to "
                f"rank {peer} ({self.peers[peer]})", rank=self.rank, peer=peer, timeout=self.timeout,
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # re-raised as a CollectiveError naming the peer
            raise self._error or CollectiveError(
                f"rank {self.rank}: could not send {kind} #{seq} to rank {peer} "
                f"({self.peers[peer]}): {e!r}", rank=self.rank, peer=peer, timeout=self.timeout) from e
        self._dirty.discard(peer)
        if array is not None:
            self.bytes_sent += int(array.nbytes)

    async def _recv(self, peer: int, kind: str, seq: int, n: int | None = None) -> Any:
        if self._error is not None:
            raise self._error
        try:
            msg = await asyncio.wait_for(self._inbox[peer].get(), self.timeout)
        except asyncio.TimeoutError:
            raise CollectiveError(
                f"rank {self.rank}: timed out after {self.timeout:g} s waiting for rank {peer} "
                f"({self.peers[peer]}) in {kind} #{seq}; that member is dead, stalled, or not "
                "calling the same collective", rank=self.rank, peer=peer, timeout=self.timeout,
            ) from None
        if isinstance(msg, _Closed):
            raise msg.error
        if msg.get("kind") != kind or msg.get("seq") != seq:
            raise CollectiveError(
                f"rank {self.rank}: rank {peer} sent {msg.get('kind')} #{msg.get('seq')} while this "
                f"rank is in {kind} #{seq}: every rank must call the same collectives in the same order",
                rank=self.rank, peer=peer, timeout=self.timeout)
        if n is None:
            return None
        data = msg.get("data")
        if msg.get("n") != n:
            raise CollectiveError(
                f"rank {self.rank}: rank {peer} sent {msg.get('n')} elements in {kind} #{seq}, "
                f"expected {n}: the tensor must have the same shape and dtype on every rank",
                rank=self.rank, peer=peer, timeout=self.timeout)
        self.bytes_received += int(data.nbytes)
        return data

    def _segments(self, n: int, itemsize: int) -> list[tuple[int, int]]:
        """Element ranges of the messages carrying ``n`` elements (at least one message)."""
        step = max(1, self.segment_bytes // max(1, itemsize))
        return [(i, min(i + step, n)) for i in range(0, n, step)] or [(0, 0)]

    async def _send_array(self, peer: int, kind: str, seq: int, array: Any = None) -> None:
        if array is None:
            return await self._send(peer, kind, seq)
        for a, b in self._segments(array.size, array.itemsize):
            await self._send(peer, kind, seq, array[a:b])

    async def _recv_array(self, peer: int, kind: str, seq: int, start: int | None = None,
                          stop: int | None = None, apply=None, itemsize: int = 1) -> None:
        if start is None:
            await self._recv(peer, kind, seq)
            return
        for a, b in self._segments(stop - start, itemsize):
            apply(start + a, start + b, await self._recv(peer, kind, seq, b - a))

    async def _exchange(self, sends: Iterable[tuple], recv: tuple | None = None) -> None:
        """Run sends (one task per peer) and one receive concurrently; received segments are
        applied as they arrive. On failure: cancel the rest, abort, re-raise."""
        everything = [asyncio.ensure_future(self._send_array(*s)) for s in sends]
        if recv is not None:
            everything.append(asyncio.ensure_future(self._recv_array(*recv)))
        try:
            await asyncio.gather(*everything)
        except BaseException as e:  # re-raised (a cancellation as itself) once the rest is cancelled and peers told
            for t in everything:
                t.cancel()
            await asyncio.gather(*everything, return_exceptions=True)
            err = e if isinstance(e, CollectiveError) else CollectiveError(
                f"rank {self.rank}: collective failed: {e!r}", rank=self.rank, timeout=self.timeout)
            await self._abort(err)
            if err is e or not isinstance(e, Exception):
                raise
            raise err from e

    async def _abort(self, err: CollectiveError) -> None:
        """Record ``err``, tell every reachable peer (best effort, bounded), close the comms."""
        if self._error is None:
            self._error = err
        msg = {"op": "abort", "reason": str(err), "blame": err.peer if err.peer is not None else self.rank}

        async def tell(peer: int, comm) -> None:
            if peer in self._dirty or comm.closed():
                return
            try:
                await asyncio.wait_for(comm.write(msg), min(self.timeout, _ABORT_SEND_SECONDS))
            except Exception as exc:  # recorded: best effort, the peer may be gone (a cancellation propagates)
                logger.debug("rank %s: cannot tell rank %s of the abort: %r", self.rank, peer, exc)

        await asyncio.gather(*(tell(p, c) for p, c in list(self._comms.items())),
                             return_exceptions=True)
        for queue in self._inbox.values():
            queue.put_nowait(_Closed(self._error))
        # closing makes peers that missed the message (a write was cut) fail at once too
        for comm in self._comms.values():
            comm.abort()

    async def _shutdown(self, polite: bool = False) -> None:
        comms = list(self._comms.items())
        if polite and self._error is None:
            async def bye(peer: int, comm) -> None:
                if peer in self._dirty or comm.closed():
                    return
                try:
                    await asyncio.wait_for(comm.write({"op": "bye"}), min(self.timeout, _ABORT_SEND_SECONDS))
                except Exception as exc:  # recorded: best effort, the peer may be gone (a cancellation propagates)
                    logger.debug("rank %s: cannot say bye to rank %s: %r", self.rank, peer, exc)

            await asyncio.gather(*(bye(p, c) for p, c in comms), return_exceptions=True)
            # Close only once every peer said bye too: closing first can drop the peer's last
            # message in flight (seen over ucxx), failing a collective that had succeeded.
            waits = [self._byes.setdefault(p, asyncio.Event()).wait() for p, c in comms
                     if p not in self._dirty and not c.closed()]
            if waits:
                try:
                    await asyncio.wait_for(asyncio.gather(*waits), self.timeout)
                except (asyncio.TimeoutError, OSError) as exc:  # recorded: a peer that never says bye is closed anyway
                    logger.debug("rank %s: not every peer said bye: %r", self.rank, exc)
        for _, comm in comms:
            try:
                await asyncio.wait_for(comm.close(), _ABORT_SEND_SECONDS)
            except Exception as exc:  # recorded: a comm that cannot close politely is aborted
                logger.debug("rank %s: aborting a comm that did not close: %r", self.rank, exc)
                comm.abort()
        readers = [t for t in self._tasks if t is not None and not t.done()]
        if readers:  # they end on the closed comms; let them, so the listener stops cleanly
            _, stuck = await asyncio.wait(readers, timeout=_ABORT_SEND_SECONDS)
            for task in stuck:
                task.cancel()
        for _ in range(3):  # ucxx retires finished handlers a loop turn or two later
            await asyncio.sleep(0)
        server = getattr(self._listener, "ucxx_server", None)
        if server is not None:  # ucxx's public count of the listener's handlers still running
            end = time.monotonic() + _ABORT_SEND_SECONDS
            while getattr(server, "active_clients", 0) and time.monotonic() < end:
                await asyncio.sleep(0.005)
            if getattr(server, "active_clients", 0):  # recorded: the listener is stopped anyway
                logger.debug("rank %s: %d ucxx clients still active", self.rank, server.active_clients)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    # -- algorithms -----------------------------------------------------------------------

    @property
    def crossover_bytes(self) -> float:
        """Size from which ``"auto"`` takes the ring: as given, else the default for the
        protocol (:data:`CROSSOVER_BYTES`; 64 KiB for protocols not listed)."""
        if self._crossover is not None:
            return self._crossover
        protocol = "ucx" if (self.protocol or "").startswith("ucx") else self.protocol
        return CROSSOVER_BYTES.get(protocol, 64 << 10)

    def algorithm_for(self, nbytes: int) -> str:
        """The all-reduce algorithm used for ``nbytes`` (``"auto"``: tree below
        :attr:`crossover_bytes`, ring from there). Depends on the size only, so ranks agree.

        >>> Collective(0, 1).algorithm_for(1 << 30), Collective(0, 1, algorithm="tree").algorithm_for(1 << 30)
        ('ring', 'tree')
        """
        if self.algorithm != "auto":
            return self.algorithm
        return "tree" if nbytes < self.crossover_bytes else "ring"

    async def _allreduce(self, kind: str, seq: int, buf: _Buffer) -> None:
        schedule = allreduce_schedule(self.algorithm_for(buf.nbytes), buf.array.size, self.size)
        await self._execute(kind, seq, buf, schedule)

    async def _broadcast(self, kind: str, seq: int, buf: _Buffer, root: int) -> None:
        await self._execute(kind, seq, buf, broadcast_schedule(buf.array.size, self.size, root))

    async def _execute(self, kind: str, seq: int, buf: _Buffer, schedule) -> None:
        """Run this rank's part of a pure schedule (:mod:`gpu.schedules`): round by round, its
        sends and its receive concurrently; received segments are added or written as they arrive."""
        itemsize = buf.array.itemsize
        for sends, recv in rank_plan(schedule, self.rank):
            out = [(t.dst, kind, seq, buf.array[t.start:t.stop]) for t in sends]
            into = None
            if recv is not None:
                apply = buf.add_ if recv.op == "add" else buf.set_
                into = (recv.src, kind, seq, recv.start, recv.stop, apply, itemsize)
            await self._exchange(out, into)

    async def _barrier(self, kind: str, seq: int, _buf: None) -> None:
        peers = [q for q in range(self.size) if q != self.rank]
        await self._exchange([(q, kind, seq) for q in peers])
        for q in peers:
            await self._exchange([], (q, kind, seq))


# ----------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class BandwidthSample:
    """One measured size: ``seconds`` per all-reduce (median over repeats on each rank, then
    the slowest rank: a collective is done when its last member is; every rank sees the same
    figures) and the algorithm bandwidth ``nbytes / seconds``."""

    nbytes: int
    seconds: float
    bandwidth: float


@dataclass(frozen=True)
class BandwidthProfile:
    """Measured all-reduce costs, and the fit ``seconds ≈ latency + nbytes / bandwidth``
    (the model :func:`gpu.tuning.exchange_seconds` uses)."""

    samples: list[BandwidthSample] = field(default_factory=list)
    latency: float = 0.0
    bandwidth: float = math.inf


def fit_latency_bandwidth(samples: Sequence[BandwidthSample]) -> tuple[float, float]:
    """Least-squares fit of ``seconds = latency + nbytes / bandwidth``; returns both.

    >>> s = [BandwidthSample(n, 1e-3 + n / 1e9, 0.0) for n in (1e3, 1e6, 1e7)]
    >>> latency, bandwidth = fit_latency_bandwidth(s)
    >>> round(latency, 6), round(bandwidth / 1e9, 3)
    (0.001, 1.0)
    """
    if not samples:
        raise ValueError("no samples to fit")
    xs = np.array([s.nbytes for s in samples], dtype=float)
    ys = np.array([s.seconds for s in samples], dtype=float)
    if len(samples) == 1 or np.ptp(xs) == 0:
        return 0.0, float(xs.mean() / ys.mean()) if ys.mean() > 0 else math.inf
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope <= 0:  # flat or noisy: latency-bound everywhere measured
        return float(max(ys.min(), 0.0)), math.inf
    if intercept < 0:  # clamp, and refit the slope through the origin
        return 0.0, float((xs * xs).sum() / (xs * ys).sum())
    return float(intercept), float(1.0 / slope)


def measure_bandwidth(collective: Collective, sizes: Iterable[int], *, repeats: int = 5,
                      warmup: int = 1, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> BandwidthProfile:
    """Time all-reduces of each size (bytes) on every rank; a collective call itself.

    Every rank must call it with the same arguments. Returns a :class:`BandwidthProfile`
    whose figures are identical on every rank (the timings are shared with one more
    all-reduce, and the slowest rank's taken), so decisions made from it (partition counts)
    agree across workers. The tensors are random (compressible data would flatter a comm
    that compresses).

    >>> profile = measure_bandwidth(Collective(0, 1), [1024, 4096], repeats=2)
    >>> [s.nbytes for s in profile.samples]
    [1024, 4096]
    """
    sizes = [int(s) for s in sizes]
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"sizes must be positive byte counts, got {sizes}")
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    itemsize = torch.empty((), dtype=dtype).element_size()
    medians = []
    for nbytes in sizes:
        t = torch.rand(max(1, nbytes // itemsize), device=device).to(dtype)
        times = []
        for i in range(warmup + repeats):
            collective.barrier()
            start = time.perf_counter()
            collective.allreduce_(t)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    table = torch.zeros(collective.size, len(sizes), dtype=torch.float64)
    table[collective.rank] = torch.tensor(medians, dtype=torch.float64)
    collective.allreduce_(table)  # every rank's medians, on every rank
    slowest = table.max(dim=0).values.tolist()
    samples = [BandwidthSample(n, float(s), n / float(s) if s > 0 else math.inf)
               for n, s in zip(sizes, slowest)]
    latency, bandwidth = fit_latency_bandwidth(samples)
    return BandwidthProfile(samples, latency, bandwidth)


def choose_algorithm(collective: Collective, nbytes: int, *, repeats: int = 3,
                     device: str | torch.device = "cpu") -> str:
    """Time the ring and the tree at ``nbytes`` on this group, keep the faster in
    ``collective.algorithm``, and return its name; a collective call (every rank calls it,
    and every rank gets the same answer).

    A group of one has nothing to time and keeps its setting:

    >>> c = Collective(0, 1)
    >>> choose_algorithm(c, 1024), c.algorithm
    ('tree', 'auto')
    """
    if collective.size == 1:
        return collective.algorithm_for(nbytes)
    seconds = {}
    for name in ("ring", "tree"):
        collective.algorithm = name
        seconds[name] = measure_bandwidth(collective, [nbytes], repeats=repeats,
                                          device=device).samples[0].seconds
    collective.algorithm = "tree" if seconds["tree"] < seconds["ring"] else "ring"
    return collective.algorithm
