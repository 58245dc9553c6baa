"""A second pass over a collection: its partitions computed again, not held across the reduction.

Many collection steps read their input twice with a reduction in between: ridge from ``XᵀX``
then the validation error with the solved weights, ``x - x.mean()``, standardising by a global
standard deviation.  Every partition of the input must then survive until the reduction over
*all* partitions is done; when the collection is larger than the workers' memory, each one is
spilled to disk and read back (once per later reader).  A partition of a lazy source (a file
read, seeded generation, a cleaning of those) is usually cheaper to compute again than to write
and read back, and computing it again holds nothing.

:func:`second_pass` is the pure rule, on one submission's tasks (``dask.task_spec`` nodes):

* a task's **phase** counts the reductions on its longest path: a task that combines two or
  more partitions of one collection (keys ``(name, i, ...)`` sharing ``name``) is *wide* and
  starts a new phase;
* a task reading a partition ``k`` together with an input of a *later* phase (the reduction's
  result, or something made from it) is a **late reader** of ``k``: it could only run after
  the reduction, so ``k`` would be held across it;
* each late reader of phase ``c`` reads a copy of ``k`` made for phase ``c`` instead: ``k`` and
  its ancestors that are ``eligible`` and not wide, under new names (one copy per phase,
  shared by every late reader of that phase); wide and ineligible ancestors (a reduction's
  small result, a plain step's value) are read as they are;
* a copy that needs nothing else copied (its **root**) waits for the late readers' other inputs
  (the reductions' results), so it runs when it can be read at once, not before.

Nothing is copied when no partition is read late.  The caller says which keys may be computed
twice (``eligible``: deterministic partition tasks, never a step that must not run twice) and
when (the run's budget, graph/memory/budget.py: when its plan says the data do not fit; the state
machine applies it to each submission, and the budget plans the run's graph with the copies).

>>> from dask.task_spec import Task, TaskRef
>>> def part(i): return [i, i + 1]
>>> def total(*ps): return sum(map(sum, ps))
>>> def centred(p, t): return [v - t for v in p]
>>> tasks = {("x", 0): Task(("x", 0), part, 0), ("x", 1): Task(("x", 1), part, 1),
...          "t": Task("t", total, TaskRef(("x", 0)), TaskRef(("x", 1))),
...          ("c", 0): Task(("c", 0), centred, TaskRef(("x", 0)), TaskRef("t")),
...          ("c", 1): Task(("c", 1), centred, TaskRef(("x", 1)), TaskRef("t"))}
>>> p = second_pass(tasks, eligible=lambda k: isinstance(k, tuple), name=lambda k, c: (k[0] + f"~again{c}",) + k[1:])
>>> sorted(p.copies), p.gates[("x~again1", 0)]
([('x', 0), ('x', 1)], ('t',))
>>> sorted(p.tasks[("c", 0)].dependencies, key=str)
[('x~again1', 0), 't']
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SecondPass", "partition_layer", "phases", "second_pass", "after", "copy_name"]


def after(value: Any, *_gates: Any) -> Any:
    """``value``, once the gates (the tasks a copy waits for) exist: a copy's root runs as
    ``after(<its own task>, *gates)``."""
    return value


@dataclass(frozen=True)
class SecondPass:
    """What :func:`second_pass` made.

    ``tasks``: the submission's tasks with the late readers rewritten and the copies added;
    ``copies``: original key -> its copies' names; ``late``: late reader -> the keys it now reads
    as copies; ``gates``: a copy's root -> the tasks it waits for; ``original``: copy name -> key;
    ``readers``: copy name -> the late readers it feeds (directly or through other copies).
    """

    tasks: dict
    copies: dict
    late: dict
    gates: dict
    original: dict
    readers: dict

    @property
    def names(self) -> frozenset:
        """The copies' names (tasks the submission adds)."""
        return frozenset(self.original)


def partition_layer(key: Hashable) -> Any:
    """The collection layer a partition key ``(name, i, ...)`` belongs to (``name``); ``None``
    for any other key.

    >>> partition_layer(("x", 3)), partition_layer("score-1f")
    ('x', None)
    """
    return key[0] if isinstance(key, tuple) and key else None


def _order(deps: Mapping[Hashable, tuple]) -> list:
    """Dependencies first (iterative: graphs have tens of thousands of partitions)."""
    out, state = [], {}
    for root in deps:
        if root in state:
            continue
        stack = [(root, iter(deps[root]))]
        state[root] = 1
        while stack:
            k, it = stack[-1]
            for d in it:
                if d not in state:
                    state[d] = 1
                    stack.append((d, iter(deps[d])))
                    break
            else:
                stack.pop()
                state[k] = 2
                out.append(k)
    return out


def phases(deps: Mapping[Hashable, tuple]) -> tuple[dict, frozenset]:
    """Each task's phase and the wide tasks (see the module's docs); inputs outside ``deps``
    exist already (phase 0).

    >>> phases({("x", 0): (), ("x", 1): (), "t": (("x", 0), ("x", 1)), ("c", 0): (("x", 0), "t")})
    ({('x', 0): 0, ('x', 1): 0, 't': 1, ('c', 0): 1}, frozenset({'t'}))
    """
    phase: dict = {}
    wide = set()
    for k in _order(deps):
        ds = deps[k]
        p = max((phase[d] for d in ds), default=0)
        if any(n >= 2 for n in Counter(partition_layer(d) for d in ds if partition_layer(d) is not None).values()):
            p += 1
            wide.add(k)
        phase[k] = p
    return phase, frozenset(wide)


def second_pass(tasks: Mapping[Hashable, Any], eligible: Callable[[Hashable], bool],
                name: Callable[[Hashable, int], Hashable]) -> SecondPass:
    """Copies for late readers of partitions (module docs).  ``tasks``: name -> task node (its
    ``dependencies`` outside ``tasks`` exist already); ``eligible(key)``: may be computed again;
    ``name(key, phase)``: a copy's name (distinct from every key)."""
    from dask.task_spec import Task, TaskRef

    deps = {k: tuple(d for d in t.dependencies if d in tasks) for k, t in tasks.items()}
    phase, wide = phases(deps)
    copyable = {k for k in tasks if k not in wide and eligible(k)}
    late: dict = defaultdict(set)  # late reader -> the inputs it reads as copies
    for d, ds in deps.items():
        top = max((phase[x] for x in ds), default=0)
        for k in ds:
            if k in copyable and isinstance(k, tuple) and phase[k] < top:
                late[d].add(k)
    if not late:
        return SecondPass(dict(tasks), {}, {}, {}, {}, {})
    made: dict = {}  # (key, phase) -> copy name
    original: dict = {}
    out = dict(tasks)

    def copy(k: Hashable, c: int) -> Hashable:
        todo, stack = [], [k]
        while stack:  # every copyable ancestor of k, copied once per phase
            x = stack.pop()
            if (x, c) in made:
                continue
            made[(x, c)] = n = name(x, c)
            original[n] = x
            todo.append(x)
            stack.extend(a for a in deps[x] if a in copyable)
        for x in todo:
            subs = {a: made[(a, c)] for a in deps[x] if a in copyable}
            out[made[(x, c)]] = tasks[x].substitute(subs, key=made[(x, c)])
        return made[(k, c)]

    for d, ks in late.items():
        c = phase[d]
        subs = {k: copy(k, c) for k in ks}
        out[d] = out[d].substitute(subs)
    # a copy's root waits for its late readers' other inputs; never for one made from a late
    # reader of the same phase (that would wait for itself)
    readers = defaultdict(set)  # copy name -> late readers it feeds (through copies)
    for d, ks in late.items():
        stack = [made[(k, phase[d])] for k in ks]
        while stack:
            n = stack.pop()
            if d in readers[n]:
                continue
            readers[n].add(d)
            stack.extend(made[(a, phase[d])] for a in deps[original[n]] if a in copyable)
    after_late = _downstream(deps, late, phase)
    gates: dict = {}
    for (x, c), n in made.items():
        if any(a in copyable for a in deps[x]):
            continue  # not a root: it waits for its copied inputs
        g = sorted({a for d in readers[n] for a in deps[d]
                    if a not in late[d] and a not in after_late[c]}, key=str)
        if g:
            gates[n] = tuple(g)
            out[n] = Task(n, after, out[n].substitute({}, key=None), *(TaskRef(a) for a in g))
    copies: dict = defaultdict(list)
    for (x, _), n in made.items():
        copies[x].append(n)
    return SecondPass(out, {k: tuple(sorted(ns, key=str)) for k, ns in copies.items()},
                      {d: tuple(sorted(ks, key=str)) for d, ks in late.items()},
                      gates, original, {n: tuple(sorted(ds, key=str)) for n, ds in readers.items()})


def _downstream(deps: Mapping, late: Mapping, phase: Mapping) -> dict:
    """Per phase, every task that is a late reader of that phase or made from one."""
    users = defaultdict(list)
    for k, ds in deps.items():
        for d in ds:
            users[d].append(k)
    out: dict = defaultdict(set)
    for d in late:
        seen = out[phase[d]]
        stack = [d]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            stack.extend(users[x])
    return out


def copy_name(key: Hashable, n: int) -> Hashable:
    """A copy's name: the key's recompute name (graph/keys.py) with copy number ``n``, so every
    figure kept by key (the monitor, the spill order, the dashboard) counts it as ``key``."""
    from ..keys import original_key, recompute_key

    return recompute_key(original_key(key), n)
