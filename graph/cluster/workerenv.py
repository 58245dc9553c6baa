"""The process environment Quiver's steps run in on a worker: the allocator and thread limits.

Dask's nanny starts every worker process with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``) so that freed memory goes back to the operating
system.  Setting that variable at all switches off glibc's *dynamic* mmap threshold: every
allocation above 128 KiB then becomes its own ``mmap``/``munmap`` pair, and every first touch
of its pages a page fault.  Steps that allocate many mid-sized arrays (a histogram gradient
boosting fit, a small torch MLP at batch 16) ran 1.4-2.4x slower in a worker than in a plain
process for that reason alone.

Quiver's rule (one owner, this module): a worker gets a fixed mmap threshold of
:data:`MMAP_THRESHOLD` (32 MiB, the ceiling glibc's own dynamic rule climbs to), so mid-sized
arrays come from the heap as in a plain process, while Dask's trim threshold still returns the
heap's free top to the system.  The trade: blocks freed in the middle of the heap stay with the
process, so a worker's unmanaged memory can sit higher.  That is why a run under a
``memory_budget`` keeps Dask's own setting (memory returned first), and every other embedded
cluster gets the fast one.  The dask config key ``quiver.worker.mmap-threshold`` changes the
threshold (``0`` or ``False``: Dask's behaviour everywhere).

Thread limits stay Dask's (``OMP_NUM_THREADS=1`` and friends per single-threaded worker), as
scikit-learn's ``n_jobs`` workers limit their inner threads too.

**Dask's statistical profiler.** Every Dask worker samples the stacks of its task threads every
10 ms (``distributed.worker.profile.interval``) on its event loop, holding the GIL while it walks
them, for the dashboard's Profile page. On two cores kept busy by scikit-learn fits that cost
0.5-0.6 CPU-seconds per worker in a 16 s run, taken from the fits (``docs/guide/speed.md``).
Embedded workers sample every :data:`PROFILE_INTERVAL` (100 ms) instead: the Profile page still
fills, at a tenth of the cost. The dask config key ``quiver.worker.profile-interval`` changes it
(``False``: Dask's own interval); a ``distributed.worker.profile.interval`` you set yourself wins.
Under a ``memory_budget`` the embedded workers run without the profiler: Dask keeps every
second's profile for 1,000 s, and on ``examples/big_table_explore.py`` that history was half of
the unmanaged memory a worker gained per minute (``docs/guide/memory.md``), which no plan sees;
``quiver.worker.profile-under-budget: true`` keeps it.

**Dask's event-loop health check.** Every Dask server (the scheduler, each nanny, each worker)
wakes its event loop every 20 ms (``distributed.admin.tick.interval``) to measure how late the
loop runs, for the "event loop was unresponsive" log line and the dashboard's tick figure.  An
embedded cluster of 2 workers has five such servers: idle, its processes used 75 CPU-ms per
second between them, 36 with the check every second instead (``distributed.admin.tick.interval``
alone; 15-20 with the memory monitor, profiler and system monitor slowed as well), and in issue
47's search (workload (c), 40 trials on a loaded 2-core machine) the scheduler's process and the
workers' event loops used 1.9 CPU-seconds instead of 2.7-3.0 with it at 200 ms, CPU the fits get
instead.  Embedded clusters check every :data:`TICK_INTERVAL` (200 ms): a loop blocked past
Dask's ``distributed.admin.tick.limit`` (3 s) is still reported.  The dask config key
``quiver.worker.tick-interval`` changes it (``False``: Dask's own); a
``distributed.admin.tick.interval`` you set yourself wins.

On a cluster you started yourself, either start the workers with the variable set (it must be
in the environment before the worker process starts)::

    MALLOC_MMAP_THRESHOLD_=33554432 dask worker tcp://scheduler:8786

or set it at run time on the running workers with :func:`tune_workers` (a worker plugin that
calls ``mallopt`` and slows the profiler's sampling; it stays for the workers' lifetime and for
workers that join later).

>>> mmap_threshold()
33554432
>>> embedded_environ(memory_budget=None)
{'MALLOC_MMAP_THRESHOLD_': '33554432'}
>>> embedded_environ(memory_budget="1 GiB")
{'MALLOC_MMAP_THRESHOLD_': '131072'}
>>> embedded_config()
{'distributed.admin.tick.interval': '200ms', 'distributed.worker.profile.interval': '100ms'}
>>> embedded_config(memory_budget="1 GiB")
{'distributed.admin.tick.interval': '200ms', 'distributed.worker.profile.enabled': False}
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "DASK_MMAP_THRESHOLD",
    "PROFILE_INTERVAL",
    "WorkerProfiler",
    "embedded_config",
    "profile_interval",
    "TICK_INTERVAL",
    "tick_interval",
    "environ_restored",
    "MMAP_THRESHOLD",
    "WorkerAllocator",
    "embedded_environ",
    "mmap_threshold",
    "probe_environment",
    "set_mmap_threshold",
    "tune_workers",
]

#: bytes: allocations below this come from the heap (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: bytes: the threshold a Dask worker has (glibc's fixed default once the trim variable is set)
DASK_MMAP_THRESHOLD = 128 * 1024

#: how often an embedded worker's profiler samples its task threads (Dask's default: 10 ms)
PROFILE_INTERVAL = "100ms"
_DASK_PROFILE_INTERVAL = "10ms"
#: how often an embedded cluster's servers check their event loop (Dask's default: 20 ms)
TICK_INTERVAL = "200ms"
_DASK_TICK_INTERVAL = "20ms"
_TICK_CONFIG = "quiver.worker.tick-interval"
_PROFILE_CONFIG = "quiver.worker.profile-interval"
_PROFILE_BUDGET_CONFIG = "quiver.worker.profile-under-budget"

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_ENV = "MALLOC_MMAP_THRESHOLD_"
_CONFIG = "quiver.worker.mmap-threshold"


def _off(value: Any) -> bool:
    """Whether a ``quiver.worker.*`` config value says "leave Dask's own setting"."""
    return value in (None, False, 0, "0", "none", "None")


def mmap_threshold() -> int:
    """The configured threshold in bytes (``0``: leave Dask's allocator setting alone)."""
    import dask
    from dask.utils import parse_bytes

    value = dask.config.get(_CONFIG, default=MMAP_THRESHOLD)
    if _off(value):
        return 0
    nbytes = parse_bytes(value) if isinstance(value, str) else int(value)
    if not 0 < nbytes <= MMAP_THRESHOLD:
        raise ValueError(f"dask config {_CONFIG!r} = {value!r}: give bytes in (0, 32 MiB] "
                         f"(glibc refuses larger thresholds), or 0 for Dask's own allocator setting")
    return nbytes


def embedded_environ(memory_budget: Any = None) -> dict[str, str]:
    """Variables an embedded cluster's workers get before they start (Dask's nanny
    ``pre-spawn-environ``, added to Dask's own).  Under a memory budget, where memory returned
    to the system matters more than allocation speed, the threshold Dask's setting gives, said
    explicitly so that nothing inherited from this process's environment changes it (Dask's
    nanny writes its variables into the starting process's ``os.environ``)."""
    nbytes = mmap_threshold()
    if memory_budget is not None or not nbytes:
        nbytes = DASK_MMAP_THRESHOLD
    return {_ENV: str(nbytes)}


def _interval(key: str, default: str, dask_key: str, dask_default: str) -> str | None:
    """The interval Quiver's config ``key`` gives (default ``default``; ``None``: off, or the
    user changed ``dask_key`` from Dask's ``dask_default``: theirs wins)."""
    import dask
    from dask.utils import parse_timedelta

    value = dask.config.get(key, default=default)
    if _off(value):
        return None
    try:
        seconds = parse_timedelta(value, default="ms")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if not seconds or seconds <= 0:
        raise ValueError(f"dask config {key!r} = {value!r}: give a duration such as {default!r}, "
                         "or False for Dask's own interval")
    dasks = dask.config.get(dask_key, default=dask_default)
    if parse_timedelta(dasks, default="ms") != parse_timedelta(dask_default, default="ms"):
        return None  # set by the user: theirs
    return str(value)


def profile_interval() -> str | None:
    """The profiler interval Quiver gives workers (``None``: Dask's, untouched): the dask config
    key ``quiver.worker.profile-interval`` (default :data:`PROFILE_INTERVAL`), unless the user
    changed ``distributed.worker.profile.interval`` from Dask's default (theirs wins)."""
    return _interval(_PROFILE_CONFIG, PROFILE_INTERVAL, "distributed.worker.profile.interval", _DASK_PROFILE_INTERVAL)


def tick_interval() -> str | None:
    """How often an embedded cluster's servers check their event loop (``None``: Dask's, untouched):
    the dask config key ``quiver.worker.tick-interval`` (default :data:`TICK_INTERVAL`), unless the
    user changed ``distributed.admin.tick.interval`` from Dask's default (theirs wins)."""
    return _interval(_TICK_CONFIG, TICK_INTERVAL, "distributed.admin.tick.interval", _DASK_TICK_INTERVAL)


def embedded_config(memory_budget: Any = None) -> dict[str, Any]:
    """Dask config an embedded cluster's scheduler, nannies and workers start with (beside Dask's
    own): the event-loop check's interval (:func:`tick_interval`), the profiler's sampling
    interval (:func:`profile_interval`); under a ``memory_budget``, no profiler (unless
    the dask config key ``quiver.worker.profile-under-budget`` is true): Dask keeps each second's
    profile for 1,000 s (``distributed.admin.low-level-log-length``), tens of MiB per worker of
    unmanaged memory that a budget cannot plan, interleaved with the run's own allocations."""
    import dask

    tick = tick_interval()
    out: dict[str, Any] = {} if tick is None else {"distributed.admin.tick.interval": tick}
    if memory_budget is not None and not dask.config.get(_PROFILE_BUDGET_CONFIG, default=False):
        return {**out, "distributed.worker.profile.enabled": False}
    interval = profile_interval()
    return out if interval is None else {**out, "distributed.worker.profile.interval": interval}


@contextlib.contextmanager
def environ_restored(names: Iterable[str], values: Mapping[str, str | None] | None = None) -> Iterator[None]:
    """For the block, this process's environment has ``values`` (``None``: unset); afterwards the
    variables in ``names`` and ``values`` are as they were before (whoever changed them meanwhile:
    Dask's nanny writes its workers' variables into the starting process's environment).

    >>> with environ_restored(["QUIVER_DOC_PROBE"], {"QUIVER_DOC_PROBE": "1"}):
    ...     os.environ["QUIVER_DOC_PROBE"]
    '1'
    >>> "QUIVER_DOC_PROBE" in os.environ
    False
    """
    values = dict(values or {})
    before = {k: os.environ.get(k) for k in set(names) | set(values)}
    _set_environ(values)
    try:
        yield
    finally:
        _set_environ(before)


def _set_environ(values: Mapping[str, str | None]) -> None:
    """Set each variable of ``values`` in this process's environment; ``None`` unsets it."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def set_mmap_threshold(nbytes: int) -> bool:
    """Set this process's glibc mmap threshold (``mallopt``); ``False`` where that is not glibc."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(nbytes)))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


def _mmapped_blocks() -> int | None:
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None)  # glibc >= 2.33
    if fn is None:
        return None
    fn.restype = _MallInfo2
    return int(fn().hblks)


def probe_environment(nbytes: int = 1 << 20) -> dict:
    """What a step running in this process sees: the allocator and thread variables, and
    whether an allocation of ``nbytes`` is served by ``mmap`` (measured with glibc's
    ``mallinfo2``; ``None`` where that is not available).

    >>> probe = probe_environment()
    >>> sorted(probe)
    ['MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'OMP_NUM_THREADS', 'mmapped']
    """
    found: dict[str, Any] = {k: os.environ.get(k) for k in (_ENV, "MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}
    libc = _libc()
    before = _mmapped_blocks()
    if libc is None or before is None:
        found["mmapped"] = None
        return found
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    ptr = libc.malloc(nbytes)
    try:
        found["mmapped"] = _mmapped_blocks() > before
    finally:
        libc.free(ptr)
    return found


try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # pragma: no cover - distributed is a dependency
    WorkerPlugin = object  # type: ignore[misc,assignment]


class WorkerAllocator(WorkerPlugin):  # type: ignore[misc]
    """Worker plugin: set the mmap threshold in each worker process (those that join later too)."""

    name = "quiver-allocator"

    def __init__(self, nbytes: int = MMAP_THRESHOLD) -> None:
        self.nbytes = int(nbytes)

    def setup(self, worker: Any) -> None:
        if set_mmap_threshold(self.nbytes):
            os.environ[_ENV] = str(self.nbytes)  # what the process now does, for whoever reads it


class WorkerProfiler(WorkerPlugin):  # type: ignore[misc]
    """Worker plugin: the profiler samples every ``interval`` (a running worker's Dask periodic
    callback ``"profile"`` is changed; a worker without the profiler is left alone)."""

    name = "quiver-profiler"

    def __init__(self, interval: str = PROFILE_INTERVAL) -> None:
        self.interval = interval

    def setup(self, worker: Any) -> None:
        from dask.utils import parse_timedelta

        pc = getattr(worker, "periodic_callbacks", {}).get("profile")
        if pc is not None:
            pc.callback_time = parse_timedelta(self.interval, default="ms") * 1000


def tune_workers(client: Any, nbytes: int | None = None) -> None:
    """Give the workers of ``client``'s cluster Quiver's allocator setting and profiler
    interval at run time (:class:`WorkerAllocator`, :class:`WorkerProfiler`).

    >>> tune_workers(client)                                   # doctest: +SKIP
    """
    client.register_plugin(WorkerAllocator(mmap_threshold() if nbytes is None else nbytes))
    interval = profile_interval()
    if interval is not None:
        client.register_plugin(WorkerProfiler(interval))
