"""Results that share their input's memory: aliases, slices, transposes.

``dask.sizeof`` measures a result by its own ``nbytes``, so a NumPy view (``x[:, :60]``,
``x[:cut]``, ``x.T``) and an alias (``da.concatenate``'s pass-through blocks, ``from_delayed``'s
``from-value``, a ``rechunk`` that keeps a block: the same object under a second key) each count
their input's bytes again, though they hold none of their own. On ordinary ``dask.array`` code
these are most of the keys: issue 46's ridge exploration computes 39x its table in
``dask.sizeof`` bytes, 7.5x in bytes any result owns. A memory plan that counts them spills
views, which frees nothing (the input they view stays) and reads back copies, which use more.

Two rules, one for the plan and one for the workers:

* :func:`shares_input` (pure, on a ``dask.task_spec`` node, before anything runs): the input a task's
  result is a view or alias of, or ``None``. An ``Alias``; ``getitem`` with a basic index (slices,
  integers, ``None``, ``Ellipsis``) or ``transpose`` applied directly to an input (not to a value a
  fused task computed first: that view's base is the task's own temporary, so the result owns it).
  :func:`views_of` maps a graph's keys to the key whose memory they share (followed to the owner).
* :func:`owned_weight` (on the workers): a result's weight for the spill buffer is ``dask.sizeof``
  unless its memory is already held by another resident result (the same object, or a NumPy view
  of the same buffer), then 0.

>>> from dask.task_spec import Task, TaskRef, Alias
>>> import operator
>>> shares_input(Alias(("b", 0), ("a", 0)))
('a', 0)
>>> shares_input(Task(("s", 0), operator.getitem, TaskRef(("a", 0)), (slice(None), slice(0, 60))))
('a', 0)
>>> shares_input(Task(("f", 0), operator.getitem, TaskRef(("a", 0)), [1, 2])) is None   # fancy: a copy
True
>>> import numpy as np
>>> base = np.zeros((100, 10))
>>> fast = {"a": base}
>>> owned_weight("v", base[:50], fast), owned_weight("c", base.copy(), fast)
(0, 8000)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["VIEW_FUNCTIONS", "shares_input", "views_of", "owner_of", "owned_weight", "root_buffer"]

#: functions whose result is a view of their first argument (with a basic index, for ``getitem``)
VIEW_FUNCTIONS = frozenset({"getitem", "transpose", "swapaxes", "squeeze", "expand_dims"})


def _basic_index(index: Any) -> bool:
    """A NumPy basic index (a view, never a copy): slices, integers, ``None``, ``Ellipsis``."""
    parts = index if isinstance(index, tuple) else (index,)
    basic = all(p is None or p is Ellipsis or isinstance(p, (slice, int)) and not isinstance(p, bool) for p in parts)
    # integers alone may pick a scalar (a copy) out of a 1-d chunk: a view only with a slice in it
    return basic and any(isinstance(p, slice) or p is None or p is Ellipsis for p in parts)


def shares_input(task: Any) -> Any:
    """The key of the input whose memory ``task``'s result shares (a view or an alias), else ``None``."""
    from dask.task_spec import Alias, DataNode, Task, TaskRef

    if isinstance(task, Alias):
        deps = list(task.dependencies)
        return deps[0] if len(deps) == 1 else None
    if not isinstance(task, Task):
        return None
    func = getattr(task, "func", None)
    name = getattr(func, "__name__", "")
    args = getattr(task, "args", ())
    if name == "_execute_subgraph" and len(args) >= 3:  # a blockwise-fused task: follow its inner chain
        return _through_subgraph(args)
    if name not in VIEW_FUNCTIONS or not args or not isinstance(args[0], TaskRef):
        return None
    if name == "getitem":
        if len(args) != 2:
            return None
        index = args[1].value if isinstance(args[1], DataNode) else args[1]
        if not _basic_index(index):
            return None
    elif any(isinstance(a, (Task, TaskRef)) for a in args[1:]):
        return None
    return args[0].key


def _through_subgraph(args: tuple) -> Any:
    """A fused blockwise task (``_execute_subgraph(inner, out, inkeys, *inputs)``): the input its
    output shares memory with, when every inner step from the output down is a view or alias."""
    from dask.task_spec import DataNode, TaskRef

    inner, out, inkeys = (a.value if isinstance(a, DataNode) else a for a in args[:3])
    inputs = args[3:]
    if not isinstance(inner, dict) or not isinstance(inkeys, tuple):
        return None
    key, seen = out, set()
    while key in inner and key not in seen:
        seen.add(key)
        key = shares_input(inner[key])
        if key is None:
            return None
    if key in inkeys:
        ref = inputs[inkeys.index(key)] if inkeys.index(key) < len(inputs) else None
        return ref.key if isinstance(ref, TaskRef) else None
    return None


def views_of(graph: Mapping) -> dict:
    """``{key: owner}`` for every task of ``graph`` whose result shares an input's memory, the owner
    being the first key up the chain that holds its own bytes.

    >>> from dask.task_spec import Task, TaskRef, Alias
    >>> g = {"a": Task("a", list, ()), "b": Alias("b", "a"), "c": Alias("c", "b")}
    >>> views_of(g)
    {'b': 'a', 'c': 'a'}
    """
    direct = {}
    for k, t in graph.items():
        d = shares_input(t)
        if d is not None and d in graph:
            direct[k] = d
    return {k: owner_of(k, direct) for k in direct}


def owner_of(key: Any, direct: Mapping) -> Any:
    """Follow ``direct`` (view -> what it views) to the key that owns the bytes."""
    seen = {key}
    while key in direct:
        key = direct[key]
        if key in seen:  # a cycle cannot happen in a DAG; stop rather than loop
            break
        seen.add(key)
    return key


def root_buffer(value: Any) -> Any:
    """The object that owns ``value``'s memory: a NumPy view's base (followed to the end), else itself."""
    while getattr(value, "base", None) is not None and type(value).__module__ == "numpy":
        value = value.base
    return value


def owned_weight(key: Any, value: Any, fast: Mapping, roots: dict | None = None) -> int:
    """``dask.sizeof(value)``, or 0 when another result in ``fast`` (key -> value, a worker's
    in-memory results) already holds the same memory. ``roots`` (id of a buffer -> keys holding it)
    makes it fast on a worker; without it ``fast`` is scanned."""
    from dask.sizeof import sizeof

    root = root_buffer(value)
    if roots is not None:
        holders = [k for k in roots.get(id(root), ()) if k != key and k in fast and root_buffer(fast[k]) is root]
        roots[id(root)] = holders + [key]
        return 0 if holders else int(sizeof(value))
    for k, v in fast.items():
        if k != key and root_buffer(v) is root:
            return 0
    return int(sizeof(value))
