"""What a step holds while it runs (its working memory), and the rules that use it: pure.

A step's **working memory** is how much its worker's process memory rose while it ran: the
process's peak during the task minus its memory when the task started (measured on the workers
by :class:`graph.memory.workmeter.WorkingMemoryPlugin`, on the first instances of each step,
per partition for collections). It includes the result itself; what is left once the result is
counted as held data is the step's **temporaries** (:func:`temporaries`), which the plan adds to
the results held while the step runs (:func:`graph.memory.plan.plan_memory`).

Three decisions live here, each with one owner:

* :func:`room_to_make`: admission. A task whose working memory would take its worker past Dask's
  pause line is held back until the worker has written enough held results to disk;
* :func:`blame_killed`: a worker restarted by its nanny for memory while one step ran alone on it
  (or while the same step ran on a second such worker) names that step, not Dask's
  ``KilledWorker`` after four workers died;
* :func:`killed_message`: that decision as the run's one-line error, with the size and the fix.

>>> M = 2**20
>>> temporaries(working=130 * M, size=10 * M) // M
120
>>> room_to_make(process=400 * M, working=120 * M, limit=640 * M, pause=0.8) // M   # 520 > 512 MiB
8
>>> blame_killed(["big-1"], rss=610 * M, held=0, baseline=150 * M, kills={"big-1": 1})
'big-1'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .sizes import format_bytes, step_of

#: the event topic a worker reports a task's working memory on (``{"key", "bytes"}``)
WORKING_TOPIC = "quiver-working-memory"

__all__ = ["WORKING_TOPIC", "blame_killed", "by_step", "killed_message", "room_to_make", "temporaries", "working_of"]


def temporaries(working: int | None, size: int) -> int:
    """A step's memory beyond its result while it runs: its measured ``working`` memory less its
    result's ``size`` (never negative; 0 when nothing was measured).

    >>> temporaries(None, 100), temporaries(50, 100), temporaries(300, 100)
    (0, 0, 200)
    """
    if not working:
        return 0
    return max(int(working) - int(size), 0)


def by_step(working: Mapping[Any, int]) -> dict[str, int]:
    """The largest working memory measured per step name (partition keys name their layer's
    operation), for ``result.stats["working_memory"]`` and for instances not yet measured.

    >>> by_step({"fit-1": 10, "fit-2": 30, ("clean-9", 0): 5})
    {'clean': 5, 'fit': 30}
    """
    out: dict[str, int] = {}
    for key, n in working.items():
        s = step_of(key)
        out[s] = max(out.get(s, 0), int(n))
    return dict(sorted(out.items()))


def working_of(key: Any, measured: Mapping[Any, int], steps: Mapping[str, int]) -> int | None:
    """A task's working memory: measured on it, else the largest measured on its step, else
    ``None`` (not known: the plan assumes no temporaries).

    >>> working_of("fit-3", {"fit-1": 10}, {"fit": 30}), working_of("load-1", {}, {})
    (30, None)
    """
    if key in measured:
        return int(measured[key])
    return steps.get(step_of(key))


def room_to_make(process: int, working: int | None, limit: int | None, pause: float | bool | None) -> int:
    """Bytes of held results a worker must write to disk before it starts a task, so that its
    process memory (``process`` now) plus the task's expected ``working`` memory stays under
    Dask's pause line (``pause`` x ``limit``); 0: the task may start now. Nothing to do when the
    working memory is unknown, the worker has no limit, or pausing is off.

    >>> M = 2**20
    >>> room_to_make(300 * M, 100 * M, 640 * M, 0.8)        # 400 MiB, under the 512 MiB line
    0
    >>> room_to_make(450 * M, 100 * M, 640 * M, 0.8) // M   # 550 MiB: 38 MiB over
    38
    >>> room_to_make(450 * M, None, 640 * M, 0.8), room_to_make(450 * M, 100 * M, None, 0.8)
    (0, 0)
    """
    if not working or not limit or pause is False or pause is None:
        return 0
    return max(int(process) + int(working) - int(limit * float(pause)), 0)


def blame_killed(running: Iterable[Any], *, rss: int, held: int, baseline: int, kills: Mapping[Any, int]) -> Any:
    """The task to blame for a worker its nanny restarted for memory, or ``None`` (let Dask retry).

    ``running``: the run's tasks that were running on it; ``rss``: its process memory when it was
    killed; ``held``: the results it held in memory; ``baseline``: an idle worker's memory;
    ``kills``: how many workers each task has now been running on when they were killed (this one
    counted). A task is to blame when it ran alone and itself took more memory than the results
    the worker held (the same step would fill the next worker too), or when it was running on two
    killed workers: the evidence comes from the first death, not from Dask's fourth.

    >>> M = 2**20
    >>> blame_killed(["a"], rss=610 * M, held=400 * M, baseline=150 * M, kills={"a": 1}) is None  # the held data
    True
    >>> blame_killed(["a", "b"], rss=610 * M, held=0, baseline=150 * M, kills={"a": 1, "b": 1}) is None
    True
    >>> blame_killed(["a", "b"], rss=610 * M, held=0, baseline=150 * M, kills={"a": 1, "b": 2})
    'b'
    >>> blame_killed([], rss=610 * M, held=0, baseline=150 * M, kills={}) is None
    True
    """
    running = list(running)
    if not running:
        return None
    if len(running) == 1 and rss - baseline - held > held:
        return running[0]
    repeated = [k for k in running if kills.get(k, 0) >= 2]
    return repeated[0] if repeated else None


def killed_message(key: Any, *, rss: int, limit: int | None, baseline: int) -> str:
    """The run's one-line error for a step that took its worker past the memory it may use.

    >>> M = 2**20
    >>> print(killed_message("big-1", rss=610 * M, limit=640 * M, baseline=150 * M))  # doctest: +ELLIPSIS
    step 'big' needed more memory than a worker has while it ran: at least 460.00 MiB beside an idle worker's 150.00 MiB; its worker reached 610.00 MiB of its 640.00 MiB memory limit and its nanny restarted it, ... bigger workers (a larger memory_budget or fewer workers).
    """
    of = f" of its {format_bytes(limit)} memory limit" if limit else ""
    return (
        f"step {step_of(key)!r} needed more memory than a worker has while it ran: at least "
        f"{format_bytes(max(rss - baseline, 0))} beside an idle worker's {format_bytes(baseline)}; its worker "
        f"reached {format_bytes(rss)}{of} and its nanny restarted it, so the run was stopped before Dask "
        "retried it on other workers. Make the step produce smaller pieces (split it, or return a "
        "pipelines.lazy collection of partitions), or give it bigger workers (a larger memory_budget "
        "or fewer workers)."
    )
