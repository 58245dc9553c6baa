"""All-reduce and broadcast schedules, pure: which chunk goes from which rank to which, when.

A schedule is a tuple of *rounds*; a round is a tuple of :class:`Transfer` s that may run at
the same time. Rank ``src`` sends elements ``[start, stop)`` of its buffer to rank ``dst``,
which adds them to (``op="add"``) or writes them over (``op="set"``) the same elements of its
own buffer. Every rank runs the rounds in order, doing its own sends and its (at most one)
receive of a round concurrently; a rank with nothing to do in a round skips it. No network
here: :class:`gpu.allreduce.Collective` executes these schedules over ``distributed.comm``,
and :func:`simulate` executes them over in-memory "ranks" (numpy arrays), so tests check the
sums with literal inputs.

* :func:`ring_allreduce`: reduce-scatter then all-gather, ``2(p−1)`` rounds of ``≈ n/p``
  elements per rank; bandwidth-optimal (every link busy in both directions).
* :func:`tree_allreduce`: binomial reduce to rank 0, then :func:`broadcast` from 0,
  ``2⌈log₂ p⌉`` rounds of ``n`` elements; fewer messages (what small tensors want).

Both end with every rank holding bit-identical values (each element is summed once, on one
rank, in one order, then copied), which SMA needs: every worker applies the same ``Δ``.

>>> import numpy as np
>>> ranks = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0]), np.array([100.0, 200.0, 300.0])]
>>> [b.tolist() for b in simulate(ring_allreduce(3, 3), ranks)]
[[111.0, 222.0, 333.0], [111.0, 222.0, 333.0], [111.0, 222.0, 333.0]]
>>> ring_allreduce(4, 2)[0]          # round 0: each rank sends one half to the other, which adds it
(Transfer(src=0, dst=1, start=0, stop=2, op='add'), Transfer(src=1, dst=0, start=2, stop=4, op='add'))
>>> [len(r) for r in tree_allreduce(5, 4)]   # reduce: 2 then 1 transfers; broadcast: 1 then 2
[2, 1, 1, 2]
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

__all__ = [
    "Transfer",
    "Schedule",
    "chunk_bounds",
    "ring_allreduce",
    "tree_reduce",
    "broadcast",
    "tree_allreduce",
    "allreduce_schedule",
    "rank_plan",
    "simulate",
]


class Transfer(NamedTuple):
    """Rank ``src`` sends its elements ``[start, stop)`` to ``dst``, which applies ``op`` there."""

    src: int
    dst: int
    start: int
    stop: int
    op: str  # "add" | "set"


Schedule = tuple  # tuple[tuple[Transfer, ...], ...]: rounds of concurrent transfers


def _check(n: int, p: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n={n!r} must be a number of elements >= 0")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"p={p!r} must be a number of ranks >= 1")


def chunk_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """Element range of chunk ``index`` when ``n`` elements are cut into ``parts`` near-equal chunks
    (the first ``n % parts`` chunks one longer; chunks may be empty when ``n < parts``).

    >>> [chunk_bounds(10, 3, i) for i in range(3)], chunk_bounds(1, 2, 1)
    ([(0, 4), (4, 7), (7, 10)], (1, 1))
    """
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


@functools.lru_cache(maxsize=256)
def ring_allreduce(n: int, p: int) -> Schedule:
    """Ring all-reduce of ``n`` elements over ``p`` ranks: ``p−1`` reduce-scatter rounds (rank r
    sends chunk ``(r−s) mod p`` right, adds chunk ``(r−s−1) mod p`` from the left), after which
    rank r holds the full sum of chunk ``(r+1) mod p``; then ``p−1`` all-gather rounds passing the
    summed chunks around (``set``).

    >>> ring_allreduce(3, 1)
    ()
    >>> [t[:4] for t in ring_allreduce(2, 2)[1]]     # the all-gather round
    [(0, 1, 1, 2), (1, 0, 0, 1)]
    """
    _check(n, p)
    rounds = []
    for phase, op, shift in (("reduce-scatter", "add", 0), ("all-gather", "set", 1)):
        for s in range(p - 1):
            rounds.append(tuple(
                Transfer(r, (r + 1) % p, *chunk_bounds(n, p, (r - s + shift) % p), op)
                for r in range(p)
            ))
    return tuple(rounds)


@functools.lru_cache(maxsize=256)
def tree_reduce(n: int, p: int) -> Schedule:
    """Binomial reduce of ``n`` elements to rank 0: in round ``i`` every rank ``r`` with
    ``r mod 2^(i+1) = 2^i`` sends its whole buffer to ``r − 2^i``, which adds it.

    >>> tree_reduce(1, 3)
    ((Transfer(src=1, dst=0, start=0, stop=1, op='add'),), (Transfer(src=2, dst=0, start=0, stop=1, op='add'),))
    """
    _check(n, p)
    rounds, mask = [], 1
    while mask < p:
        rounds.append(tuple(Transfer(r, r - mask, 0, n, "add") for r in range(mask, p, 2 * mask)))
        mask <<= 1
    return tuple(rounds)


@functools.lru_cache(maxsize=256)
def broadcast(n: int, p: int, root: int = 0) -> Schedule:
    """Binomial broadcast of ``root``'s ``n`` elements: in round ``i`` every rank that has them
    (virtual rank ``v = (r − root) mod p < 2^i``) sends to virtual rank ``v + 2^i``.

    >>> [[(t.src, t.dst) for t in rnd] for rnd in broadcast(2, 4, root=1)]
    [[(1, 2)], [(1, 3), (2, 0)]]
    """
    _check(n, p)
    if not isinstance(root, int) or not 0 <= root < p:
        raise ValueError(f"root={root!r} must be a rank in [0, {p})")
    rounds, mask = [], 1
    while mask < p:
        rounds.append(tuple(Transfer((v + root) % p, (v + mask + root) % p, 0, n, "set")
                            for v in range(min(mask, p - mask))))
        mask <<= 1
    return tuple(rounds)


@functools.lru_cache(maxsize=256)
def tree_allreduce(n: int, p: int) -> Schedule:
    """:func:`tree_reduce` to rank 0, then :func:`broadcast` from rank 0."""
    return tree_reduce(n, p) + broadcast(n, p, 0)


def allreduce_schedule(algorithm: str, n: int, p: int) -> Schedule:
    """The schedule of ``algorithm`` (``"ring"`` or ``"tree"``) for ``n`` elements on ``p`` ranks.

    >>> len(allreduce_schedule("ring", 8, 4)), len(allreduce_schedule("tree", 8, 4))
    (6, 4)
    """
    if algorithm == "ring":
        return ring_allreduce(n, p)
    if algorithm == "tree":
        return tree_allreduce(n, p)
    raise ValueError(f"algorithm={algorithm!r}; use 'ring' or 'tree'")


@functools.lru_cache(maxsize=1024)
def rank_plan(schedule: Schedule, rank: int) -> tuple[tuple[tuple[Transfer, ...], Transfer | None], ...]:
    """What ``rank`` does, round by round: ``(its sends, its receive or None)``, rounds where it
    does nothing left out. Raises if a round gives it two receives (schedules here never do).

    >>> rank_plan(tree_allreduce(3, 2), 1)
    (((Transfer(src=1, dst=0, start=0, stop=3, op='add'),), None), ((), Transfer(src=0, dst=1, start=0, stop=3, op='set')))
    """
    plan = []
    for rnd in schedule:
        sends = tuple(t for t in rnd if t.src == rank)
        recvs = [t for t in rnd if t.dst == rank]
        if len(recvs) > 1:
            raise ValueError(f"a round gives rank {rank} {len(recvs)} receives; a schedule may give at most one")
        if sends or recvs:
            plan.append((sends, recvs[0] if recvs else None))
    return tuple(plan)


def simulate(schedule: Schedule, buffers: Sequence) -> list:
    """Run ``schedule`` over in-memory ranks: ``buffers[r]`` is rank r's array (numpy, torch, or
    anything sliceable with ``+``). Returns new buffers (the inputs are not modified). Sends of a
    round read the buffers as they were before the round, as concurrent sends do.

    >>> import numpy as np
    >>> simulate(tree_allreduce(2, 3), [np.array([1, 2]), np.array([3, 4]), np.array([5, 6])])
    [array([ 9, 12]), array([ 9, 12]), array([ 9, 12])]
    """
    bufs = [b.copy() if hasattr(b, "copy") else b.clone() for b in buffers]
    for rnd in schedule:
        sent = [bufs[t.src][t.start:t.stop].copy() if hasattr(bufs[t.src], "copy")
                else bufs[t.src][t.start:t.stop].clone() for t in rnd]
        for t, data in zip(rnd, sent):
            if t.op == "add":
                bufs[t.dst][t.start:t.stop] += data
            else:
                bufs[t.dst][t.start:t.stop] = data
    return bufs
