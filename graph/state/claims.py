"""Which packed task trains which member: claims made at run time (docs/architecture.md §7.3).

A packable group (``graph.compiling.packing``) becomes one packed task per worker thread; none of them
owns members when the run starts. Each packed task *claims* members from its group's table as
it has places (when it starts, and whenever a member leaves it, pruned or finished), so no
packed task idles while a member of its group waits, wherever that member was declared.

The table is a plain dict: the decision here is pure (:func:`claim`, tested with literal inputs
and hypothesis in ``tests/test_claims.py``); ``graph.compiling.packing.claim_on_scheduler`` applies it
atomically on the scheduler (one ``run_on_scheduler`` call from the worker; the table lives in
the scheduler's task metadata, ``["quiver", "claims", name]``).

Rules:

- A member is claimed by one pack at most, in the group's declaration order.
- A pack's first call of an attempt gets back the members it claimed in earlier attempts (a
  worker died: Dask reruns the pack, which retrains them from their seeds; their reports replay,
  and the run does not count a replayed report twice).
- ``fair=True`` (a pack filling its first places) takes at most its share of what is unclaimed,
  ``ceil(unclaimed / (packs not started yet + 1))``, so the pack that starts first does not take
  every member while another worker thread is about to start a pack of its own.
- **Take-over** (``horizon=``: each member's most iterations): a pack that holds no unfinished
  member and finds none unclaimed takes one over from a pack holding two or more unfinished
  members: the one that has made the fewest iterations (ties to the later-declared), and only
  while replaying what it has made costs less than what is left (``2 * made < horizon``). It
  retrains the member from its seed (a replay: the run counts no report twice, and every rung
  answer is already given); the old owner learns of it from :func:`progress` at its next epoch
  and drops the member. So survivors of a rung spread over idle worker threads instead of
  sharing one. A pack that holds an unfinished member never takes one over (no ping-pong).
- **Moves** (``moves=True``: the group's trainer can hand a member's state over, as
  :class:`gpu.PackedLoop` and :class:`gpu.PackedTrainer` can): a take-over moves the member instead of replaying it. The
  table records the move (``table["moving"]``); the old owner, told by :func:`progress` at
  its next epoch, hands the member's state over (:func:`give`: its training state, or
  ``None`` for a member it had not started), and the taker waits for it (:func:`collect`) and
  goes on from there: no epoch is trained twice. Since nothing is retrained, a move pays
  while the member has two epochs or more left (``made + 2 <= horizon``: the taker waits up
  to one epoch of the old owner, which trains the member meanwhile). A member that ended on
  the old owner before it could hand it over (pruned, or trained out, reported ``done``)
  stays there (the taker drops it); if the old owner's attempt changes or its task is no
  longer running (``alive=False``), the taker replays the member from its seed, as without moves.
- :func:`progress` records, per pack, how many iterations each member has made and which are
  finished (trained out or pruned: never taken over), and returns the members it lost.

>>> t = {}
>>> claim(t, "p0", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=1)
['a']
>>> claim(t, "p0", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=5, fair=True)
['b', 'c']
>>> claim(t, "p1", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=5)
['d']
>>> claim(t, "p0", 1, ["a", "b", "c", "d"], ["p0", "p1"], want=1)  # p0 restarted: its members again
['a', 'b', 'c']
>>> progress(t, "p1", made={"d": 12}, done=["d"])                  # p1 trained d out: nothing lost
[]
>>> claim(t, "p1", 0, ["a", "b", "c", "d"], ["p0", "p1"], want=1, horizon=dict.fromkeys("abcd", 12))
['c']
>>> progress(t, "p0", made={"a": 2, "b": 2, "c": 2}, done=[])      # p1 took c over
['c']
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["arriving", "claim", "collect", "give", "progress"]

_NONE = object()


def claim(table: dict, pack: Hashable, attempt: Hashable, order: Sequence[Hashable], packs: Sequence[Hashable],
          want: int, fair: bool = False, horizon: Mapping[Hashable, int] | None = None,
          moves: bool = False) -> list:
    """Claim up to ``want`` unclaimed members of ``order`` for ``pack`` (``table`` is updated in
    place); returns the members ``pack`` now gets: on the first call of a new ``attempt`` the ones
    it had claimed before, then new ones (``attempt``: any id, new for each run of the
    pack, e.g. ``graph.tasks.iterative``'s task attempt). ``packs``: every pack of the group (for ``fair``).
    ``horizon`` (each member's most iterations): when nothing is unclaimed, an idle pack takes
    one member over (module docstring); ``moves``: the taker will wait for the member's state
    (:func:`collect`) instead of replaying it."""
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
    if horizon is not None and want > 0 and not out and not free:
        taken = _take_over(table, pack, order, horizon, moves)
        if taken is not None:
            out.append(taken)
    return out


def _take_over(table: dict, pack: Hashable, order: Sequence[Hashable], horizon: Mapping[Hashable, int],
               moves: bool = False) -> Any:
    owner: dict = table.setdefault("owner", {})
    done: dict = table.setdefault("done", {})
    made: dict = table.setdefault("made", {})
    held: dict = {}
    for k in order:
        if k in owner and k not in done:
            held[owner[k]] = held.get(owner[k], 0) + 1
    if held.get(pack):  # it still trains a member of its own
        return None
    given_up = {k for k, old, _, _ in table.get("takeovers", ()) if old == pack}  # a member moves once per pack
    best = None
    for k in order:
        p = owner.get(k)
        if p is None or p == pack or k in done or held.get(p, 0) < 2 or k in given_up:
            continue
        left = horizon.get(k, 0) - made.get(k, 0)
        if (left < 2) if moves else (made.get(k, 0) >= left):  # a move: a wait of one epoch; a replay: made epochs
            continue
        if best is None or made.get(k, 0) <= made.get(best, 0):  # fewest made; ties to the later-declared
            best = k
    if best is not None:
        table.setdefault("takeovers", []).append((best, owner[best], pack, made.get(best, 0)))
        if moves:
            old = owner[best]
            table.setdefault("moving", {})[best] = {"from": old, "to": pack,
                                                    "attempt": table.get("attempt", {}).get(old)}
        else:
            made[best] = 0  # replayed from its seed
        owner[best] = pack
    return best


def progress(table: dict, pack: Hashable, made: Mapping[Hashable, int], done: Iterable[Hashable] = ()) -> list:
    """Record what ``pack`` has trained (``made``: iterations per member it trains; ``done``: members
    it trained out or saw pruned) and return the members of ``made`` it no longer owns (taken over:
    drop them). Only the owner's word counts."""
    owner: dict = table.setdefault("owner", {})
    table_made: dict = table.setdefault("made", {})
    table_done: dict = table.setdefault("done", {})
    done = list(done)
    for k in done:  # it ended here before its taker got its state: it stays (the taker drops it)
        move = table.get("moving", {}).get(k)
        if owner.get(k) != pack and move is not None and move["from"] == pack and _open(move):
            owner[k] = pack
            move["kept"] = True
    lost = [k for k in made if owner.get(k) != pack]
    for k, n in made.items():
        if owner.get(k) == pack:
            table_made[k] = n
    for k in done:
        if owner.get(k) == pack:
            table_done[k] = True
    return lost


def _open(move: Mapping) -> bool:
    """A move whose state has not been handed over, kept or given up yet."""
    return "state" not in move and not move.get("kept") and not move.get("closed")


def arriving(table: Mapping, pack: Hashable, got: Iterable[Hashable]) -> list:
    """The members of ``got`` (what :func:`claim` just gave ``pack``) that move to it from another
    pack: ``pack`` waits for their state (:func:`collect`) before training them.

    >>> t = {"moving": {"b": {"from": "p0", "to": "p1", "attempt": "x"}}}
    >>> arriving(t, "p1", ["a", "b"]), arriving(t, "p0", ["b"])
    (['b'], [])
    """
    moving = table.get("moving", {})
    return [k for k in got if k in moving and moving[k]["to"] == pack and not moving[k].get("kept")
            and not moving[k].get("closed")]


def give(table: dict, pack: Hashable, member: Hashable, state: Any) -> bool:
    """The old owner ``pack`` hands ``member``'s state over (``None``: it had not started it);
    ``False`` when no move of it from ``pack`` waits for a state (the taker gave up, or it stayed).

    >>> t = {"moving": {"b": {"from": "p0", "to": "p1", "attempt": "x"}}}
    >>> give(t, "p1", "b", b"..."), give(t, "p0", "b", b"state"), give(t, "p0", "b", b"again")
    (False, True, False)
    """
    move = table.get("moving", {}).get(member)
    if move is None or move["from"] != pack or not _open(move):
        return False
    move["state"] = state
    return True


def collect(table: dict, pack: Hashable, member: Hashable, alive: bool = True) -> tuple[str, Any]:
    """What the taker ``pack`` does with ``member`` now: ``("resume", state)`` (handed over;
    ``state`` ``None``: start it, it had not begun), ``("wait", None)`` (the old owner has not
    reached its next epoch), ``("drop", None)`` (it ended on the old owner, which keeps it), or
    ``("replay", None)`` (the old owner restarted, or its task is no longer running:
    ``alive=False``; retrain it from its seed). ``("start", None)`` for a member that is not moving.

    >>> t = {"owner": {"b": "p1"}, "attempt": {"p0": "x"}, "made": {"b": 3},
    ...      "moving": {"b": {"from": "p0", "to": "p1", "attempt": "x"}}}
    >>> collect(t, "p1", "b")
    ('wait', None)
    >>> give(t, "p0", "b", b"state"), collect(t, "p1", "b"), collect(t, "p1", "b")
    (True, ('resume', b'state'), ('start', None))
    """
    move = table.get("moving", {}).get(member)
    if move is None or move["to"] != pack or move.get("closed"):
        return ("start", None)
    if move.get("kept") or table.get("owner", {}).get(member) != pack:
        move["closed"] = True
        return ("drop", None)
    if "state" in move:
        move["closed"] = True
        return ("resume", move.pop("state"))
    if not alive or table.get("attempt", {}).get(move["from"]) != move["attempt"]:
        move["closed"] = True
        table.setdefault("made", {})[member] = 0  # retrained from its seed
        return ("replay", None)
    return ("wait", None)
