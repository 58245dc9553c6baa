"""Compilation: one deterministic task per unique (function, parameters, inputs), no cluster needed."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

import pytest
from dask.task_spec import Task, TaskRef
from hypothesis import given, settings
from hypothesis import strategies as st

import graph
from pipelines import Pipeline, PipelineError, combine, grid
from tests import steps

ROOT = __file__.rsplit("/tests/", 1)[0]


def nested_pipeline():
    p = Pipeline("nested")
    src = p.source(steps.source, seed=2)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3]), sq=steps.square)
    b = a.explore("b", grid(steps.mul, n=[1, 10]))
    return a, b


def test_graph_uses_task_spec_and_counts():
    _, b = nested_pipeline()
    c = graph.compile(b)
    assert all(isinstance(t, Task) for t in c.graph.values())
    # 1 source + 4 explore-a alternatives + 4 x 2 explore-b alternatives
    assert c.unique_tasks == 1 + 4 + 8
    assert c.naive_tasks == 8 * 3
    assert len(c.branches) == 8
    assert c.output_keys == [br.key for br in c.branches]
    first = c.branches[0]
    assert first.choices == {"a": ("add", {"n": 1}), "b": ("mul", {"n": 1})}
    assert c.branches[-1].choices == {"a": ("sq", {}), "b": ("mul", {"n": 10})}
    # each task refers to its input through a TaskRef to the input's key
    task = c.graph[first.key]
    assert task.dependencies == {first.lineage[-2]}
    assert isinstance(task.args[0], TaskRef)
    # lineage runs from the source to the branch's own key
    assert first.lineage[0].startswith("source-") and first.lineage[-1] == first.key
    assert first.key.startswith("mul-")


def test_shared_prefixes_are_one_task():
    a, b = nested_pipeline()
    ca, cb = graph.compile(a), graph.compile(b)
    assert set(ca.graph) <= set(cb.graph)
    prefix_keys = {br.lineage[1] for br in cb.branches}
    assert prefix_keys == set(ca.output_keys)


def test_same_work_under_two_labels_is_one_task():
    src = Pipeline("dup").source(steps.source)
    node = src.explore("a", one=steps.square, also=steps.square)
    c = graph.compile(node)
    assert len(c.branches) == 2 and c.unique_tasks == 2
    assert c.branches[0].key == c.branches[1].key


def test_keys_change_with_params_inputs_and_code():
    src = Pipeline("k").source(steps.source)
    k1 = graph.compile(src.then(steps.add, n=1)).output_keys[0]
    k2 = graph.compile(src.then(steps.add, n=2)).output_keys[0]
    k3 = graph.compile(Pipeline("k").source(steps.source, seed=5).then(steps.add, n=1)).output_keys[0]
    assert len({k1, k2, k3}) == 3

    def make(body):
        ns = {}
        exec(textwrap.dedent(body), ns)
        return ns["f"]

    f1 = make("def f(v):\n    return v\n")
    f2 = make("def f(v):\n    return {'x': 1}\n")
    assert graph.compile(src.then(f1)).output_keys[0] != graph.compile(src.then(f2)).output_keys[0]


def test_partial_and_lambda_steps_tokenize_deterministically():
    src = Pipeline("p").source(steps.source)
    add3 = functools.partial(steps.add, n=3)
    a = graph.compile(src.then(add3)).output_keys[0]
    b = graph.compile(src.then(functools.partial(steps.add, n=3))).output_keys[0]
    assert a == b and a.startswith("add-")
    lam = graph.compile(src.then(lambda v: v)).output_keys[0]
    assert lam == graph.compile(src.then(lambda v: v)).output_keys[0]


def test_keys_identical_in_another_process():
    _, b = nested_pipeline()
    here = graph.compile(b.choose("x", k=2)).output_keys
    code = textwrap.dedent(
        """
        import json, graph
        from tests.test_compile import nested_pipeline
        _, b = nested_pipeline()
        print(json.dumps(graph.compile(b.choose("x", k=2)).output_keys))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"},
    )
    assert json.loads(out.stdout) == here


def test_combine_joins_on_shared_explores_and_crosses_the_rest():
    src = Pipeline("c").source(steps.source)
    a = src.explore("a", grid(steps.add, n=[1, 2]))
    b = a.explore("b", grid(steps.mul, n=[3, 4]))
    c = src.explore("c", grid(steps.mul, n=[5, 6, 7]))
    joined = graph.compile(combine(steps.join, left=b, right=a))
    assert len(joined.branches) == 2 * 2  # joined on "a"
    for br in joined.branches:
        assert set(br.choices) == {"a", "b"}
    crossed = graph.compile(combine(steps.join, left=b, right=c))
    assert len(crossed.branches) == 4 * 3
    assert {tuple(br.choices) for br in crossed.branches} == {("a", "b", "c")}


def test_choose_gates_downstream_branches():
    _, b = nested_pipeline()
    node = b.choose("x", per="a", k=1).then(steps.square)
    c = graph.compile(node)
    assert len(c.chooses) == 1 and len(c.chooses[0].inputs) == 8
    assert all(br.gates == ((0, i),) for i, br in enumerate(c.branches))
    groups = {c.chooses[0].group_of(i) for i in range(8)}
    assert len(groups) == 4
    assert c.single_value is False
    assert graph.compile(b.choose("x")).single_value is True


def test_combine_with_no_agreeing_branches_is_refused():
    src = Pipeline("c").source(steps.source)
    a = src.explore("a", grid(steps.add, n=[1]))
    a2 = src.explore("a", grid(steps.add, n=[2]))
    with pytest.raises(PipelineError, match="no combination of the inputs agrees"):
        graph.compile(combine(steps.join, left=a, right=a2))


def test_compile_does_not_import_pipelines_in_graph():
    code = "import sys, graph.compiling.compiler, graph.run.executor; print('pipelines' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- property: unique_tasks == number of distinct (function, params, inputs) triples ------------

FUNCS = {"add": steps.add, "mul": steps.mul}

op = st.one_of(
    st.tuples(st.just("then"), st.sampled_from(["add", "mul"]), st.integers(0, 2)),
    st.tuples(
        st.just("explore"),
        st.lists(st.tuples(st.sampled_from(["add", "mul"]), st.integers(0, 2)), min_size=1, max_size=4),
        st.booleans(),
    ),
    st.tuples(st.just("choose"), st.sampled_from([None, 1, 2]), st.just(None)),
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 1), ops=st.lists(op, min_size=1, max_size=6))
def test_unique_tasks_equal_distinct_triples(seed, ops):
    node = Pipeline("prop").source(steps.source, seed=seed)
    identities = [("source", (("seed", seed),), ())]  # branch value identities at the current node
    seen = set(identities)
    explored = 0
    for kind, a, b in ops:
        if kind == "then":
            node = node.then(FUNCS[a], n=b)
            identities = [(a, (("n", b),), (ident,)) for ident in identities]
        elif kind == "explore":
            named = b
            alts = {}
            positional = []
            for j, (fname, n) in enumerate(a):
                if named:
                    alts[f"alt{j}"] = functools.partial(FUNCS[fname], n=n)
                else:
                    positional.append(grid(FUNCS[fname], n=[n]))
            if not named and len({(f, n) for f, n in a}) < len(a):
                continue  # identical unnamed alternatives are refused as ambiguous (tested elsewhere)
            node = node.explore(f"e{explored}", *positional, **alts)
            explored += 1
            if named:
                new = [(("partial", f), (("n", n),), (ident,)) for ident in identities for f, n in a]
            else:
                new = [(f, (("n", n),), (ident,)) for ident in identities for f, n in a]
            identities = new
        else:
            if explored == 0:
                continue
            node = node.choose("x", k=a)
            continue
        seen.update(identities)
    c = graph.compile(node)
    # partial(add, n=1) and add with n=1 are the same work (Call.of unwraps the partial)
    normal = {_normalise(i) for i in seen}
    assert c.unique_tasks == len(normal)


def _normalise(ident):
    fname, params, inputs = ident
    if isinstance(fname, tuple):
        fname = fname[1]
    return (fname, params, tuple(_normalise(i) for i in inputs))
