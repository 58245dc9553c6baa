"""Which packed task trains which member: claims made at run time (docs/architecture.md §7.3).

A packable group (``graph.packing``) becomes one packed task per worker thread; none of them
owns members when the run starts. Each packed task *claims* members from its group's table as
it has places (when it starts, and whenever a member leaves it, pruned or finished), so no
packed task idles while a member of its group waits, wherever that member was declared.

The table is a plain dict: the decision here is pure (:func:`claim`, tested with literal inputs
and hypothesis in ``tests/test_claims.py``); :func:`claim_on_scheduler` applies it atomically
on the scheduler (one ``run_on_scheduler`` call from the worker; the table lives in the
scheduler's task metadata, ``["quiver", "claims", name]``).

Rules:

- A member is claimed by one pack at most, in the group's declaration order.
- A pack's first call of an attempt gets back the members it claimed in earlier attempts (a
  worker died: Dask reruns the pack, which retrains them from their seeds; their reports replay,
  and the run does not count a replayed report twice).
- ``fair=True`` (a pack filling its first places) takes at most its share of what is unclaimed,
  ``ceil(unclaimed / (packs not started yet + 1))``, so the pack that starts first does not take
  every member while another worker thread is about to start a pack of its own.

>>> t = {}
>>> claim(t, "p0", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=1)
['a']
>>> claim(t, "p0", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=5, fair=True)
['b', 'c']
>>> claim(t, "p1", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=5)
['d']
>>> claim(t, "p0", 1, ["a", "b", "c", "d"], ["p0", "p1"], want=1)  # p0 restarted: its members again
['a', 'b', 'c']
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

__all__ = ["claim", "claim_on_scheduler", "forget_claims"]

_NONE = object()


def claim(table: dict, pack: Hashable, attempt: Hashable, order: Sequence[Hashable], packs: Sequence[Hashable],
          want: int, fair: bool = False) -> list:
    """Claim up to ``want`` unclaimed members of ``order`` for ``pack`` (``table`` is updated in
    place); returns the members ``pack`` now gets: on the first call of a new ``attempt`` the ones
    it had claimed before, then new ones (``attempt``: any id, new for each run of the
    pack, e.g. ``graph.iterative``'s task attempt). ``packs``: every pack of the group (for ``fair``)."""
    owner: dict = table.setdefault("owner", {})
    attempts: dict = table.setdefault("attempt", {})
    out: list = []
    if attempts.get(pack, _NONE) != attempt:  # this attempt's first call
        attempts[pack] = attempt
        out = [k for k in order if owner.get(k) == pack]
    free = [k for k in order if k not in owner]
    n = max(0, want - len(out))
    if fair:
        unstarted = sum(1 for p in packs if p not in attempts)
        n = min(n, -(-len(free) // (unstarted + 1)))
    for k in free[:n]:
        owner[k] = pack
        out.append(k)
    return out


def claim_on_scheduler(dask_scheduler: Any = None, *, name: str, **kwargs: Any) -> list:
    """:func:`claim` on the table ``name`` in the scheduler's task metadata, run by
    ``client.run_on_scheduler`` (the scheduler runs it in its event loop: no two claims interleave)."""
    keys = ["quiver", "claims", name]
    table = dask_scheduler.get_metadata(keys=keys, default=None)
    if table is None:
        table = {}
        dask_scheduler.set_metadata(keys=keys, value=table)
    return claim(table, **kwargs)


def forget_claims(dask_scheduler: Any = None, *, names: Sequence[str]) -> None:
    """Drop the tables ``names`` (a run's, when it ends)."""
    tables = dask_scheduler.get_metadata(keys=["quiver", "claims"], default={})
    for n in names:
        tables.pop(n, None)
