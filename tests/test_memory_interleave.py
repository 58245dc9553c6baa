"""The plan's model of Dask's order for partitions (graph/memory/interleave.py): literal inputs,
random graphs, and a compiled collection exploration planned with it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from graph.memory.interleave import interleave, rootish_groups
from pipelines import Pipeline, grid
from tests import collection_steps as cs

MiB = 2**20


def _deps(d):
    return lambda k: d[k]


def test_a_source_partition_is_read_by_every_sibling_branch_before_the_next_one_is_made():
    # 6 chunks, read by two cleanings (branch a, then branch b, each depth-first) and summed per branch
    parts = range(6)
    d = {("src", i): () for i in parts}
    d |= {("a", i): (("src", i),) for i in parts} | {("b", i): (("src", i),) for i in parts}
    d |= {"sum-a": tuple(("a", i) for i in parts), "sum-b": tuple(("b", i) for i in parts)}
    depth_first = [k for i in parts for k in (("src", i), ("a", i))] + ["sum-a"] + [("b", i) for i in parts] + ["sum-b"]
    out = interleave(depth_first, _deps(d), threads=2)
    assert out[:3] == [("src", 0), ("a", 0), ("b", 0)]  # b's read of chunk 0 runs before chunk 1 is made
    for i in parts:
        made, last_read = out.index(("src", i)), max(out.index(("a", i)), out.index(("b", i)))
        between = out[made + 1:last_read]
        assert not any(k[0] == "src" for k in between if isinstance(k, tuple))  # no other chunk made meanwhile
    assert sorted(out, key=str) == sorted(depth_first, key=str)


def test_root_ish_follows_dasks_rule_few_inputs_many_tasks():
    d = {("x", i): () for i in range(4)}  # 4 tasks: not more than twice 2 threads
    d |= {("y", i): ("seed",) for i in range(5)} | {"seed": ()}  # 5 tasks reading one task: root-ish
    d |= {("z", i): (("y", i),) for i in range(5)}  # reads a group of 5: not root-ish
    assert rootish_groups(d, _deps(d), threads=2) == {"y"}
    assert rootish_groups(d, _deps(d), threads=3) == set()  # 5 is not more than 6


@st.composite
def dags(draw):
    """A random topological order: string keys (plain steps) and partition groups."""
    n = draw(st.integers(1, 40))
    groups = draw(st.lists(st.sampled_from(["p", "q", "r", None]), min_size=n, max_size=n))
    keys, seen = [], {}
    for i, g in enumerate(groups):
        if g is None:
            keys.append(f"step-{i}")
        else:
            seen[g] = seen.get(g, -1) + 1
            keys.append((g, seen[g]))
    rng = random.Random(draw(st.integers(0, 2**16)))
    deps = {k: tuple(rng.sample(keys[:i], min(i, rng.randint(0, 2)))) for i, k in enumerate(keys)}
    return keys, deps


@settings(max_examples=200, deadline=None)
@given(dags(), st.integers(1, 4))
def test_every_task_once_after_its_inputs(dag, threads):
    order, deps = dag
    out = interleave(order, _deps(deps), threads)
    assert len(out) == len(order) and set(out) == set(order)
    at = {k: i for i, k in enumerate(out)}
    assert all(at[d] < at[k] for k in out for d in deps[k])


@settings(max_examples=200, deadline=None)
@given(dags(), st.integers(1, 4))
def test_without_root_ish_tasks_the_depth_first_order_stands(dag, threads):
    order, deps = dag
    if not rootish_groups(order, _deps(deps), threads):
        assert interleave(order, _deps(deps), threads) == list(order)


def test_the_plan_holds_a_source_partition_for_its_sibling_reads_not_until_the_last_branch(tmp_path):
    import graph

    files = cs.write_table(tmp_path, parts=12, rows=600)
    node = Pipeline("interleaved").source(cs.table, files=files).size_hint("10 MiB").explore(
        "clean", *[grid(cs.clean, method=[m]) for m in ("drop", "zero")]).explore("model", grid(cs.score, w=[1.0]))
    c = node.choose("mse", mode="min").compile()
    reads = list(cs.table.__wrapped__(files).__dask_keys__())
    small = {k: 1024 for k in c.graph if k not in reads}  # measured: everything but the source is tiny
    plan = graph.plan_memory(c, "4 GiB", workers=2, baseline=200 * MiB, sizes=small)
    at = plan.positions()
    # each partition's uses (the two cleanings' reads) come before the next partition is read (in
    # the order Dask reads them: dask.order's, not necessarily by index)
    reads = sorted(reads, key=at.__getitem__)
    for a, b in zip(reads, reads[1:]):
        assert max(plan.decisions[a].uses) < at[b]
    # so the plan holds one source partition at a time, not the whole source (12 x 10 MiB) until
    # the second cleaning's branch comes (the depth-first model's prediction)
    assert 10 * MiB <= plan.predicted_data_peak < 12 * MiB
