"""Siblings side by side: the alternatives of one explore start on different workers.

Why: Dask places a task on a worker that holds its inputs (``distributed.scheduler.decide_worker``
looks at no other worker), so the alternatives that read one result (the scalers of one
source, the feature sets of one scaling, the models of one feature set) are all sent to the
worker that computed it, and only work stealing moves some of them away. Stealing needs the
victim's answer, from its event loop, and a step that holds the GIL keeps that loop silent
until it ends: scipy's full SVD (a PCA with ``svd_solver="full"``) held it for 0.8 s, so on a
2-worker cluster three of four 0.9 s prefix steps ran one after the other on one worker while
the other waited (``benchmarks/common_cases.py``'s digits workload, Dask's task stream and its
``stealing`` events, docs/guide/speed.md). A run knows its siblings before it submits them: it
sends each group of them over the workers, round robin, as *loose* restrictions (Dask runs one
elsewhere if its worker is gone, and may still steal it), so no answer is needed.

The rule is :func:`spread` (pure). Left out of it: tasks with no input (Dask spreads those
itself), training steps (their shared inputs are copied by ``graph.sharedcopies`` and packed
tasks are placed by ``graph.packing.place_packs``), and, by the caller, runs under a memory
budget (its plan counts one copy of each result: a sibling elsewhere copies its input) and runs
of Dask collections (partitions are placed by Dask). The cost: a group's input is copied once
to each worker its siblings are sent to, as a steal would copy it. Dask config
``quiver.spread-siblings: False`` turns it off.

>>> deps = {"a": {"src"}, "b": {"src"}, "c": {"src"}, "d": {"a"}}
>>> spread(deps, order=["a", "b", "c", "d"], slots=["w1", "w2"])
{'a': 'w1', 'b': 'w2', 'c': 'w1'}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["enabled", "spread"]

_CONFIG = "quiver.spread-siblings"


def spread(dependencies: Mapping[str, Iterable[str]], order: Sequence[str], slots: Sequence[str],
           skip: Iterable[str] = ()) -> dict[str, str]:
    """``{task: worker}`` for the sibling groups among ``dependencies`` (``{task: its inputs}``):
    tasks that read exactly the same inputs (at least one), two or more of them. Each group is
    dealt over ``slots`` (one worker address per worker thread) in ``order`` (the run's priority
    order: a task not in it comes after those that are, by name), each group starting on the slot
    after the last one the previous group used, so that the counts stay level over the run.
    Tasks in ``skip`` are neither placed nor counted. One slot, or none: nothing is placed.

    >>> spread({"x": {"s"}, "y": {"s"}, "z": {"t"}}, order=["y", "x", "z"], slots=["w1", "w2"])
    {'y': 'w1', 'x': 'w2'}
    >>> spread({"m1": {"f"}, "m2": {"f"}, "m3": {"f"}, "n1": {"g"}, "n2": {"g"}},
    ...        order=["m1", "m2", "m3", "n1", "n2"], slots=["a", "b"])
    {'m1': 'a', 'm2': 'b', 'm3': 'a', 'n1': 'b', 'n2': 'a'}
    >>> spread({"x": {"s"}, "y": {"s"}}, order=["x", "y"], slots=["only"])
    {}
    """
    if len(slots) < 2:
        return {}
    skip = set(skip)
    rank = {k: i for i, k in enumerate(order)}
    groups: dict[frozenset, list[str]] = {}
    for key, deps in dependencies.items():
        deps = frozenset(deps)
        if deps and key not in skip:
            groups.setdefault(deps, []).append(key)
    placed: dict[str, str] = {}
    slot = 0
    members = [sorted(g, key=lambda k: (k not in rank, rank.get(k, 0), k)) for g in groups.values() if len(g) >= 2]
    for group in sorted(members, key=lambda g: (g[0] not in rank, rank.get(g[0], 0), g[0])):
        for key in group:
            placed[key] = slots[slot % len(slots)]
            slot += 1
    return placed


def enabled() -> bool:
    """Whether runs spread siblings (dask config ``quiver.spread-siblings``, default True); a
    value that is not a boolean is an error that says how to set it.

    >>> enabled()
    True
    """
    import dask

    value = dask.config.get(_CONFIG, default=True)
    if not isinstance(value, bool):
        raise ValueError(f"dask config {_CONFIG} must be True or False, got {value!r}: "
                         f"e.g. dask.config.set({{'{_CONFIG}': False}}) to let Dask place every task")
    return value
