"""The order Dask runs one submission's partition tasks in, as the memory plan models it.

Quiver gives every task of a branch its branch's priority (``graph.state.order``), and the
plan's first model of a run was that order taken literally: each branch depth-first, one after
the other.  Dask does not run partitions that way.  A partition task that reads a source
(a file read, a seeded chunk: a *root-ish* task, in a large group with almost no dependencies)
is queued on the scheduler and given to a worker only when the worker has a free slot; every
other task goes to a worker the moment its inputs exist.  So once a source partition is made,
every sibling branch's reads of it (the three cleanings of one chunk, say) run before the next
partition starts: the run goes partition by partition across branches, and a source partition
is held for moments, not until the last branch reaches it.  Measured on ``--churn``: the
depth-first model predicted twice the measured peak.

:func:`interleave` is that rule, pure: among the tasks whose inputs are done, any task that is
not root-ish runs first (the highest priority first: the earliest in the depth-first order);
a root-ish task starts only when nothing else can run.  Without root-ish tasks it returns the
depth-first order unchanged, so plain-step explorations are planned as before.

>>> deps = {("src", 0): (), ("src", 1): (), ("src", 2): (),
...         "a0": (("src", 0),), "a1": (("src", 1),), "a2": (("src", 2),),
...         "b0": (("src", 0),), "b1": (("src", 1),), "b2": (("src", 2),)}
>>> depth_first = [("src", 0), "a0", ("src", 1), "a1", ("src", 2), "a2", "b0", "b1", "b2"]
>>> interleave(depth_first, deps.__getitem__, threads=1)
[('src', 0), 'a0', 'b0', ('src', 1), 'a1', 'b1', ('src', 2), 'a2', 'b2']
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence

from ..state.secondpass import partition_layer

__all__ = ["dask_ranks", "interleave", "rootish_groups"]


def dask_ranks(keys: Sequence[Hashable], deps: Callable[[Hashable], Iterable[Hashable]]) -> dict:
    """``dask.order.order`` of ``keys`` (inputs outside them count as done): the tie-break Dask uses
    among tasks of one priority, as a rank per key.

    >>> d = {"a": (), "b": ("a",), "c": ()}
    >>> r = dask_ranks(list(d), d.__getitem__)
    >>> sorted(r.values()), r["a"] < r["b"]
    ([0, 1, 2], True)
    """
    from dask.order import order
    from dask.task_spec import DataNode, Task, TaskRef

    inside = set(keys)
    graph = {}
    for k in keys:
        refs = [TaskRef(d) for d in deps(k) if d in inside]
        graph[k] = Task(k, _noop, *refs) if refs else DataNode(k, None)
    return dict(order(graph))


def _noop(*_args):
    return None


def _group(key: Hashable) -> Hashable:
    """A key's task group, as Dask names them: a partition ``(name, i, ...)`` belongs to ``name``;
    any other key is a group of its own."""
    layer = partition_layer(key)
    return key if layer is None else layer


def rootish_groups(keys: Iterable[Hashable], deps: Callable[[Hashable], Iterable[Hashable]], threads: int) -> set:
    """The partition groups Dask treats as root-ish (``distributed.scheduler``'s ``is_rootish``):
    more tasks than twice the cluster's threads, reading fewer than five tasks in all.

    >>> d = {("x", i): () for i in range(5)} | {("y", i): (("x", i),) for i in range(5)}
    >>> sorted(rootish_groups(d, d.__getitem__, threads=2))
    ['x']
    """
    keys = list(keys)
    size = Counter(_group(k) for k in keys)
    read: dict[Hashable, set] = defaultdict(set)
    for k in keys:
        read[_group(k)].update(_group(d) for d in deps(k))
    partitioned = {partition_layer(k) for k in keys} - {None}
    return {g for g in partitioned if size[g] > 2 * threads and sum(size.get(r, 1) for r in read[g]) < 5}


def interleave(order: Sequence[Hashable], deps: Callable[[Hashable], Iterable[Hashable]], threads: int,
               rootish: set | None = None, tie: dict | None = None) -> list:
    """``order`` (one submission's tasks, depth-first, each after its inputs) as Dask runs it:
    ready non-root-ish tasks first, earliest in ``order`` first; a root-ish task only when none
    is ready. Inputs outside ``order`` count as done. ``rootish``: the root-ish groups when
    already known (:func:`rootish_groups` over the whole run, whose group sizes a single
    submission may not show). ``tie``: for a collection's partitions, which all carry their
    stage's one priority (``graph.state.order.stage_priority``), Dask's own order among them
    (:func:`dask_ranks`): they run before the stage's plain tasks, in that order.

    >>> deps = {("s", 0): (), ("s", 1): (), ("a", 0): (("s", 0),), ("a", 1): (("s", 1),),
    ...         ("b", 0): (("s", 0),), ("b", 1): (("s", 1),)}
    >>> depth_first = [("s", 0), ("a", 0), ("s", 1), ("a", 1), ("b", 0), ("b", 1)]
    >>> tie = {("s", 0): 0, ("a", 0): 1, ("b", 0): 2, ("s", 1): 3, ("a", 1): 4, ("b", 1): 5}  # Dask's, say
    >>> interleave(depth_first, deps.__getitem__, 1, rootish=set(), tie=tie)
    [('s', 0), ('a', 0), ('b', 0), ('s', 1), ('a', 1), ('b', 1)]
    """
    pos = {k: i for i, k in enumerate(order)}
    if tie:
        pos = {k: (0, tie[k]) if k in tie else (1, i) for k, i in pos.items()}
    if rootish is None:
        rootish = rootish_groups(order, deps, threads)
    waiting: dict[Hashable, int] = {}
    readers: dict[Hashable, list] = defaultdict(list)
    for k in order:
        inside = [d for d in set(deps(k)) if d in pos]
        waiting[k] = len(inside)
        for d in inside:
            readers[d].append(k)
    ready: list = []  # (is root-ish, position, key): other tasks before root-ish ones
    for k in order:
        if not waiting[k]:
            heapq.heappush(ready, (_group(k) in rootish, pos[k], k))
    out: list = []
    while ready:
        _, _, k = heapq.heappop(ready)
        out.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, (_group(r) in rootish, pos[r], r))
    return out
