"""Walking a task graph: one dependencies-first order, without recursion (chains of thousands).

>>> deps = {"c": ["a", "b"], "b": ["a"], "a": []}
>>> list(postorder(["c"], deps.__getitem__, set()))
['a', 'b', 'c']
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator

__all__ = ["postorder"]


def postorder(roots: Iterable[Hashable], deps: Callable[[Hashable], Iterable[Hashable]],
              done: set) -> Iterator[Hashable]:
    """Yield every key reachable from ``roots`` after what it depends on, each once.

    ``deps(key)`` lists a key's dependencies; the last listed is visited first. ``done`` holds
    the keys already yielded (by this or an earlier walk sharing it) and is updated in place.
    """
    for root in roots:
        stack = [(root, False)]
        while stack:
            k, expanded = stack.pop()
            if k in done:
                continue
            if expanded:
                done.add(k)
                yield k
                continue
            stack.append((k, True))
            stack.extend((d, False) for d in deps(k) if d not in done)
