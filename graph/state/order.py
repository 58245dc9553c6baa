"""The run order: which results a run needs (its *targets*) and in what order it runs them.

One function owns the order, :func:`run_targets`, and both its users derive from it: the
state machine's task priorities (:func:`priority`, a Dask ``priority`` annotation, higher
first) and the memory plan's model of the run (``graph.memory.plan.execution_order``,
which walks the targets in :func:`run_order`, and within a stage lets a root-ish source's
partitions run across sibling branches, as Dask does: ``graph.memory.interleave``). The rule (docs/architecture.md §4):
targets open stage by stage (a branch behind ``s`` chooses opens once they all kept it);
among open targets, the one behind more chooses runs first, then declaration order (choose
inputs by choose and input, then the output branches); each target depth-first.

>>> from graph.spec import SourceSpec, ExploreSpec, ChooseSpec, Alternative, Call
>>> def load(): return 1
>>> def add(x, n): return {"x": x + n}
>>> src = SourceSpec("demo", Call(load, (), "load"))
>>> alts = tuple(Alternative("add", Call(add, (("n", n),), "add")) for n in (1, 2))
>>> from graph.compiling.compiler import compile_spec
>>> ts = run_targets(compile_spec(ChooseSpec(ExploreSpec(src, "n", alts), "x", "x")))
>>> [(t.kind, t.stage) for t in ts]
[('choose', 0), ('choose', 0), ('output', 1), ('output', 1)]
>>> [t.id for t in run_order(ts)], [priority(t, len(ts)) for t in ts]
([0, 1, 2, 3], [4, 3, 6, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "priority", "run_order", "run_targets", "stage_priority"]


@dataclass(frozen=True)
class Target:
    """A result the run needs: a choose input's metric (``kind="choose"``) or an output
    branch's value (``kind="output"``). ``id`` is its declaration position."""

    id: int
    kind: str
    branch: Any  # graph.compiling.compiler.Branch
    choose: int | None = None  # the choose point (choose targets)
    index: int = 0  # input index at that choose, or output branch index
    metric_key: str | None = None

    @property
    def key(self) -> str:
        """The key whose result resolves the target."""
        return self.metric_key or self.branch.key

    @property
    def stage(self) -> int:
        """How many chooses must keep the branch before it runs."""
        return len(self.branch.gates)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every task the target needs (its branch's lineage, then the metric read)."""
        lineage = tuple(self.branch.lineage)
        return lineage + (self.metric_key,) if self.metric_key else lineage


def run_targets(compiled: Any) -> list[Target]:
    """Every target of ``compiled`` in declaration order (``Target.id`` is the position)."""
    out: list[Target] = []
    for cp in compiled.chooses:
        for i, b in enumerate(cp.inputs):
            out.append(Target(len(out), "choose", b, cp.index, i, cp.metric_keys[i]))
    for j, b in enumerate(compiled.branches):
        out.append(Target(len(out), "output", b, None, j))
    return out


def priority(target: Target, n: int) -> int:
    """The Dask priority of ``target``'s tasks among ``n`` targets: behind more chooses
    first, then declaration order (depth-first branch after branch)."""
    return target.stage * n + (n - target.id)


def stage_priority(target: Target, n: int) -> int:
    """The Dask priority of a collection's partitions that ``target`` needs: the highest of its
    stage, the same for every branch of the stage, so Dask's own order decides among them (a
    partition's readers in every branch before the next partition); still behind any later
    stage's and ahead of every plain step of its own.

    >>> from types import SimpleNamespace as T
    >>> [stage_priority(T(stage=0, id=i), 3) for i in range(3)], [priority(T(stage=0, id=i), 3) for i in range(3)]
    ([3, 3, 3], [3, 2, 1])
    """
    return target.stage * n + n


def run_order(targets: Sequence[Target]) -> list[Target]:
    """The order a run goes through ``targets`` as they open: stage by stage, and within a
    stage by :func:`priority` (which, within one stage, is declaration order)."""
    n = len(targets)
    return sorted(targets, key=lambda t: (t.stage, -priority(t, n)))
