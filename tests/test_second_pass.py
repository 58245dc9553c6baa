"""graph/state/secondpass.py: partitions read again after a reduction are computed again for
that read (copies), not held across it. The rule on literal graphs and generated ones (the
copied graph computes the same values and holds no partition across a reduction), the state
machine's use of it (events in, instructions out), and a budgeted run on a real cluster."""

from __future__ import annotations

import numpy as np
import pytest
from dask.task_spec import Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.state.secondpass import phases, second_pass
from pipelines import Pipeline, grid, lazy


def part(i, salt=0):
    return np.arange(4.0) + i + salt


def total(*parts):
    return float(sum(p.sum() for p in parts))


def centred(p, t):
    return p - t


def plus(p, q=0.0):
    return p + q


def copy_name(key, phase):
    return (f"{key[0]}~again{phase}",) + tuple(key[1:])


def tuples(key):
    return isinstance(key, tuple)


def evaluate(tasks, keys):
    """Each key's value, by running the task nodes in dependency order (no Dask scheduler)."""
    done: dict = {}

    def get(k):
        stack = [k]
        while stack:
            x = stack[-1]
            if x in done:
                stack.pop()
                continue
            todo = [d for d in tasks[x].dependencies if d not in done]
            if todo:
                stack.extend(todo)
                continue
            done[x] = tasks[x]({d: done[d] for d in tasks[x].dependencies})
            stack.pop()
        return done[k]

    return {k: get(k) for k in keys}


def centring(n=3):
    """x_i, t = sum(x), c_i = x_i - t: every x_i is read again after the reduction."""
    tasks = {("x", i): Task(("x", i), part, i) for i in range(n)}
    tasks["t"] = Task("t", total, *(TaskRef(("x", i)) for i in range(n)))
    for i in range(n):
        tasks[("c", i)] = Task(("c", i), centred, TaskRef(("x", i)), TaskRef("t"))
    return tasks


def test_a_partition_read_after_its_reduction_is_copied_and_the_copy_waits_for_the_reduction():
    tasks = centring()
    sp = second_pass(tasks, tuples, copy_name)
    assert sp.late == {("c", i): (("x", i),) for i in range(3)}
    assert sp.copies == {("x", i): (("x~again1", i),) for i in range(3)}
    for i in range(3):
        assert sp.tasks[("c", i)].dependencies == {("x~again1", i), "t"}
        assert sp.gates[("x~again1", i)] == ("t",)  # computed once t exists, read at once
        assert sp.tasks[("x~again1", i)].dependencies == {"t"}
    assert sp.tasks["t"].dependencies == {("x", i) for i in range(3)}  # the first pass is unchanged
    before = evaluate(tasks, [("c", i) for i in range(3)])
    after = evaluate(sp.tasks, [("c", i) for i in range(3)])
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_nothing_is_copied_without_a_late_reader_or_when_the_key_may_not_run_twice():
    chain = {("x", i): Task(("x", i), part, i) for i in range(3)}
    chain.update({("y", i): Task(("y", i), plus, TaskRef(("x", i))) for i in range(3)})
    chain["t"] = Task("t", total, *(TaskRef(("y", i)) for i in range(3)))
    sp = second_pass(chain, tuples, copy_name)
    assert not sp.original and sp.tasks == chain  # map then reduce: nothing is read late
    tasks = centring()
    sp = second_pass(tasks, lambda k: k != ("x", 1) and tuples(k), copy_name)
    assert set(sp.copies) == {("x", 0), ("x", 2)}
    assert ("x", 1) in sp.tasks[("c", 1)].dependencies  # not eligible: read as it is


def test_a_copy_reads_a_reduction_in_its_chain_as_it_is_and_copies_the_partitions_above_it():
    """x_i -> m = mean(x) -> y_i = x_i - m -> s = sum(y) -> z_i = y_i / s: the second reduction's
    late readers get a copy of y_i, which reads a copy of x_i and the original m."""
    n = 3
    tasks = {("x", i): Task(("x", i), part, i) for i in range(n)}
    tasks["m"] = Task("m", total, *(TaskRef(("x", i)) for i in range(n)))
    tasks.update({("y", i): Task(("y", i), centred, TaskRef(("x", i)), TaskRef("m")) for i in range(n)})
    tasks["s"] = Task("s", total, *(TaskRef(("y", i)) for i in range(n)))
    tasks.update({("z", i): Task(("z", i), centred, TaskRef(("y", i)), TaskRef("s")) for i in range(n)})
    phase, wide = phases({k: tuple(d for d in t.dependencies if d in tasks) for k, t in tasks.items()})
    assert wide == {"m", "s"} and phase[("y", 0)] == 1 and phase[("z", 0)] == 2
    sp = second_pass(tasks, tuples, copy_name)
    assert sp.tasks[("y", 0)].dependencies == {("x~again1", 0), "m"}  # y reads x after m: a copy
    assert sp.tasks[("z", 0)].dependencies == {("y~again2", 0), "s"}
    assert sp.tasks[("y~again2", 0)].dependencies == {("x~again2", 0), "m"}  # m is small: not copied
    assert sp.gates[("x~again2", 0)] == ("s",)
    keys = [("z", i) for i in range(n)]
    before, after = evaluate(tasks, keys), evaluate(sp.tasks, keys)
    assert all(np.allclose(before[k], after[k]) for k in keys)


@st.composite
def layered(draw):
    """A random exploration of collection steps: partitioned layers made from earlier layers
    (map), reductions (a wide task over one layer) and layers that read a partition together
    with a reduction (a second pass)."""
    n = draw(st.integers(2, 4))
    tasks = {("L0", i): Task(("L0", i), part, i) for i in range(n)}
    layers, reductions = ["L0"], []
    for j in range(1, draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["map", "reduce", "late"] if reductions else ["map", "reduce"]))
        src = draw(st.sampled_from(layers))
        if kind == "reduce":
            r = f"r{j}"
            tasks[r] = Task(r, total, *(TaskRef((src, i)) for i in range(n)))
            reductions.append(r)
            continue
        name = f"L{j}"
        if kind == "map":
            tasks.update({(name, i): Task((name, i), plus, TaskRef((src, i)), float(j)) for i in range(n)})
        else:
            r = draw(st.sampled_from(reductions))
            tasks.update({(name, i): Task((name, i), centred, TaskRef((src, i)), TaskRef(r)) for i in range(n)})
        layers.append(name)
    return tasks


@settings(max_examples=150, deadline=None)
@given(layered())
def test_copies_compute_the_same_values_and_leave_no_partition_read_after_a_reduction(tasks):
    sp = second_pass(tasks, tuples, copy_name)
    assert set(tasks) <= set(sp.tasks) and sp.names == set(sp.tasks) - set(tasks)
    before, after = evaluate(tasks, list(tasks)), evaluate(sp.tasks, list(tasks))  # also: acyclic
    for k in tasks:
        assert np.allclose(before[k], after[k])
    # no partition is read late any more: a second pass over the result copies nothing
    again = second_pass(sp.tasks, lambda k: tuples(k) and k not in sp.names, copy_name)
    assert not again.late
    # every copy is read, and only by a late reader or another copy of the same phase
    readers = {n: {k for k, t in sp.tasks.items() if n in t.dependencies} for n in sp.names}
    assert all(readers[n] and readers[n] <= set(sp.late) | sp.names for n in sp.names)
    for n, gates in sp.gates.items():  # a root waits only for what exists without the copies
        assert not set(gates) & sp.names


def test_the_state_machine_submits_copies_when_the_plan_does_not_fit():
    """Events in, instructions out: under ``MemoryPlanned(droppable, copyable)`` the submission's late
    readers read copies, which the run holds no future for; without it nothing changes."""
    from graph.state.events import MemoryPlanned, Start, Submit
    from graph.state.machine import ExplorationState

    node = (Pipeline("centre").source(lazy(_array), n=4)
            .explore("f", grid(_centre_then_score, scale=[1.0, 2.0])).choose("score", mode="min"))
    compiled = node.compile()
    loose = ExplorationState(compiled)
    plain = [i for i in loose.handle(MemoryPlanned(frozenset()), Start()) if isinstance(i, Submit)]
    assert plain and all(not i.internal for i in plain)
    tight = ExplorationState(compiled)
    copyable = frozenset(compiled.step_of)  # what the budget hands it: every collection task here
    out = [i for i in tight.handle(MemoryPlanned(frozenset(), copyable), Start()) if isinstance(i, Submit)]
    internal = frozenset().union(*(i.internal for i in out))
    assert internal and all(isinstance(n, tuple) for n in internal)
    copies = frozenset(n for n in internal if "~again" in n[0])
    submitted = {k: t for i in out for k, t in i.tasks.items()}
    assert internal <= set(submitted) and not internal & tight.held  # no future: Dask lets them go
    # partitions only the submission reads are Dask's to let go too (issue 46), never a target's
    unpinned = internal - copies
    assert unpinned and not unpinned & {t.key for t in tight.targets}
    assert all(n in i.priority for i in out for n in i.tasks)  # every task has its priority
    readers = {k for k, t in submitted.items() if t.dependencies & copies and k not in copies}
    # the late readers: one per chunk and scale (the centring, fused into the squares' sum), each
    # reading its chunk's copy and the mean (not copied: a reduction's small result)
    assert len(readers) == 8 and all(isinstance(k, tuple) for k in readers)
    assert all(len(submitted[k].dependencies - copies) == 1 for k in readers)
    assert tight.copies_made == len(copies)


def _array(n, size=1000):
    import dask.array as da

    return da.arange(n * float(size), chunks=size)


def _centred(x, m):
    return x - m


def _centre_then_score(x, scale):
    """x - mean(x): each chunk is read again after the mean (a second pass)."""
    c = (x * scale).map_blocks(_centred, x.mean(), dtype=float, name=f"centred-{scale}")
    return {"score": (c**2).sum()}


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_budgeted_run_whose_data_do_not_fit_computes_the_second_pass_again_with_the_same_results():
    """A real cluster: with a budget whose first plan evicts (300 chunks hinted at 2 MiB each, over
    their own 8 KB, against ~180 MiB per worker for results: a user's hint is taken over what the
    array's chunks say), the centring's chunks are computed again after the mean instead of held,
    and every branch scores as in a run without a budget."""
    node = (Pipeline("centre").source(lazy(_array), n=300).size_hint("2 MiB")
            .explore("f", grid(_centre_then_score, scale=[1.0, 2.0, 3.0])).choose("score", mode="min"))
    budgeted = node.run(workers=2, memory_budget="1 GiB", quiet=True, progress=False)
    plain = node.run(workers=2, quiet=True, progress=False)
    assert budgeted.memory_plan.second_passes is True
    assert budgeted.stats["second_pass_copies"] > 0 and plain.stats["second_pass_copies"] == 0
    assert budgeted.stats["executed_tasks"] > plain.stats["executed_tasks"]  # the copies ran
    assert budgeted.table["score"].tolist() == pytest.approx(plain.table["score"].tolist(), rel=1e-12)
    assert budgeted.table["score"].tolist() == pytest.approx([_expected(300 * 1000, s) for s in (1.0, 2.0, 3.0)], rel=1e-9)


def test_an_arrays_chunks_are_sized_when_it_compiles_and_a_hint_wins():
    """The first plan need not guess a ``dask.array``'s partitions: each step's output chunks are
    hinted with their exact bytes (shape x itemsize) when the exploration compiles; a user's
    ``size_hint`` replaces them, and what the array does not know (inside a step) stays unhinted."""
    node = (Pipeline("centre").source(lazy(_array), n=3, size=500)
            .explore("f", grid(_scaled, scale=[1.0, 2.0])))
    c = node.compile()
    by_step = {}
    for k, n in c.size_hints.items():
        if isinstance(k, tuple):  # partitions
            by_step.setdefault(k[0].split("-")[0], set()).add(n)
    assert by_step["arange"] == by_step["mul"] == {4000}, by_step  # 500 float64 per chunk
    assert sum(1 for k in c.size_hints if isinstance(k, tuple) and k[0].startswith("mul")) == 6  # 3 chunks x 2
    hinted = (Pipeline("centre").source(lazy(_array), n=3, size=500).size_hint("1 MiB")
              .explore("f", grid(_scaled, scale=[1.0]))).compile()
    assert {n for k, n in hinted.size_hints.items() if k[0].startswith("arange")} == {2**20}


def _scaled(x, scale):
    return x * scale


def _expected(n, scale):
    x = np.arange(float(n))
    return float((((x * scale) - x.mean()) ** 2).sum())
