"""Alternatives of an explore: plain callables, named callables, and parameter grids.

>>> def pca(x, n_components): return x
>>> g = grid(pca, n_components=[8, 16])
>>> [(a.label, a.call.params) for a in expand("explore('pca')", (g,), {})]
[('pca', (('n_components', 8),)), ('pca', (('n_components', 16),))]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any

from graph.errors import PipelineError
from graph.spec import Alternative, Call, fn_name

from .space import Space

__all__ = ["Grid", "grid", "expand"]


class Grid:
    """``grid(fn, **lists)``: one alternative per point of the Cartesian product of ``lists``.

    Parameters are varied in the order given, the last one fastest.
    """

    def __init__(self, fn: Callable, **lists: Any):
        self.fn = fn
        self.lists = lists
        self._values: list | None = None  # the checked lists, materialised once (generators too)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.lists.items())
        name = fn_name(self.fn) if callable(self.fn) else repr(self.fn)
        return f"grid({name}, {inner})"

    def size(self, where: str) -> int:
        """The number of grid points (checked, without building them)."""
        n = 1
        for vals in self._checked(where):
            n *= len(vals)
        return n

    def points(self, where: str) -> list[tuple[tuple[str, Any], ...]]:
        return [tuple(point) for point in itertools.product(*self._checked(where))]

    def _checked(self, where: str) -> list:
        if self._values is not None:
            return self._values
        if not callable(self.fn):
            raise PipelineError(
                f"{where}: {self!r} needs a callable as its first argument, got "
                f"{type(self.fn).__name__}. Pass the step function itself: grid(fit, C=[1, 10])."
            )
        if not self.lists:
            raise PipelineError(
                f"{where}: {self!r} has no parameters to vary; pass the function itself "
                "instead of a grid, or give lists: grid(fit, C=[1, 10])."
            )
        values = []
        for name, vals in self.lists.items():
            if isinstance(vals, (Mapping, Set)):
                raise PipelineError(
                    f"{where}: {self!r}: parameter {name!r} must be a list of values to try, got a "
                    f"{type(vals).__name__} (a mapping iterates its keys, a set has no fixed order). "
                    f"Write {name}=[...] with the values in the order to try them."
                )
            if isinstance(vals, (str, bytes)) or not isinstance(vals, Iterable):
                raise PipelineError(
                    f"{where}: {self!r}: parameter {name!r} must be a list of values to try, "
                    f"got {type(vals).__name__} {vals!r}. Write {name}=[{vals!r}] for one value."
                )
            vals = list(vals)
            if not vals:
                raise PipelineError(
                    f"{where}: {self!r}: the list for {name!r} is empty, so the grid has no "
                    f"points. Give at least one value, e.g. {name}=[...]."
                )
            values.append([(name, v) for v in vals])
        self._values = values
        return values


def grid(fn: Callable, **lists: Any) -> Grid:
    """Expand ``fn`` into one alternative per point of the parameter grid.

    >>> def fit(x, C, penalty): return x
    >>> len(grid(fit, C=[0.1, 1, 10], penalty=["l2"]).points("example"))
    3
    """
    return Grid(fn, **lists)


def count(positional: tuple, named: dict[str, Any], where: str) -> int:
    """How many alternatives ``expand`` would make (grids are sized, not built)."""
    return sum(a.size(where) if isinstance(a, Grid) else 1 for a in (*positional, *named.values()))


def expand(where: str, positional: tuple, named: dict[str, Any]) -> tuple[Alternative, ...]:
    """Turn ``explore``'s arguments into labelled alternatives, checking each one."""
    out: list[Alternative] = []
    items = [(None, a) for a in positional] + list(named.items())
    for label, alt in items:
        if isinstance(alt, Grid):
            base = label or (fn_name(alt.fn) if callable(alt.fn) else "grid")
            for point in alt.points(where):
                out.append(Alternative(base, Call.of(alt.fn, point)))
        elif isinstance(alt, Space):  # a search's sampler proposes its distributions (issue 47)
            dists = alt.distributions(where)
            name = label or (fn_name(alt.fn) if callable(alt.fn) else "space")
            out.append(Alternative(name, Call.of(alt.fn, alt.fixed), space=dists))
        elif callable(alt):
            out.append(Alternative(label or fn_name(alt), Call.of(alt)))
        else:
            what = f"alternative {label!r}" if label else f"alternative #{len(out) + 1}"
            raise PipelineError(
                f"{where}: {what} is a {type(alt).__name__} ({alt!r}), not a callable. Pass a "
                "step function fn(value, **params), grid(fn, param=[...]) for a parameter grid, or "
                "space(fn, param=FloatDistribution(...)) for a search space."
            )
    if not out:
        raise PipelineError(
            f"{where}: nothing to explore. Give at least one alternative: a function, "
            "name=function, or grid(fn, param=[...])."
        )
    seen: dict[tuple, int] = {}
    for i, a in enumerate(out):
        ident = (a.label, repr(a.call.params), repr(a.space))
        if ident in seen:
            raise PipelineError(
                f"{where}: alternatives #{seen[ident] + 1} and #{i + 1} are both labelled "
                f"{a.label!r} with the same parameters, so the table could not tell them apart. "
                "Name them: explore(name, first=f, second=g)."
            )
        seen[ident] = i
    return tuple(out)
