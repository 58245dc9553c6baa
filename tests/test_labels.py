"""What a user reads names each branch by its choices (graph/labels.py): short, stable, never a
memory address; the table keeps the user's parameter values and types; pruned rows carry their
last report; and, on a real LocalCluster, a ``gpu.Loop`` exploration over two network widths
gets two distinct labels in the table, the JSON and the dashboard's training state."""

from __future__ import annotations

import functools
import json
import re
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph.labels import branch_labels, choice_text, plain_value, value_text

ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def make_net(width, depth=2):
    return (width, depth)


class Opaque:
    """An object with the default ``repr`` (``<...Opaque object at 0x...>``)."""


# ---- the rule, on literals --------------------------------------------------------------------


def test_callables_and_partials_show_their_name_and_bound_arguments():
    assert value_text(make_net) == "make_net"
    assert value_text(functools.partial(make_net, 64)) == "make_net(64)"
    assert value_text(functools.partial(make_net, 64, depth=3)) == "make_net(64, depth=3)"
    assert value_text(functools.partial(functools.partial(make_net, 64), depth=1)) == "make_net(64, depth=1)"
    assert value_text(lambda: 1) == "lambda"
    assert value_text(Opaque()) == "Opaque" and value_text(Opaque) == "Opaque"


def test_a_gpu_loop_shows_the_fields_it_sets():
    import gpu

    loop = gpu.Loop(model=functools.partial(make_net, 64))
    assert value_text(loop) == "Loop(model=make_net(64))"
    assert choice_text("train_loop", {"loop": loop, "lr": 0.01}) == "train_loop(loop=Loop(model=make_net(64)), lr=0.01)"


def test_plain_values_stay_values_and_objects_become_text():
    assert [plain_value(v) for v in (3, 0.5, None, True, "rbf")] == [3, 0.5, None, True, "rbf"]
    assert plain_value(functools.partial(make_net, 32)) == "make_net(32)"
    assert isinstance(plain_value(__import__("numpy").int64(4)), int)


def test_labels_show_only_what_differs_and_name_a_shared_parameter_by_its_explore():
    loops = [[("t", "train_loop", {"loop": functools.partial(make_net, w), "lr": 0.01, "batch_size": 32})]
             for w in (64, 128)]
    assert branch_labels(loops) == ["loop=make_net(64)", "loop=make_net(128)"]
    two = [[("a", "add", {"n": 1}), ("b", "mul", {"n": 2})], [("a", "add", {"n": 1}), ("b", "mul", {"n": 3})]]
    assert branch_labels(two) == ["b.n=2", "b.n=3"]
    model = [[("model", "svc", {"C": 1})], [("model", "tree", {"max_depth": None})], [("model", "tree", {"max_depth": 3})]]
    assert branch_labels(model) == ["model=svc", "model=tree max_depth=None", "model=tree max_depth=3"]  # C: one value
    assert branch_labels([]) == []


# ---- the rule, on generated input -------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
objects = st.one_of(
    scalars,
    st.builds(Opaque),
    st.integers(1, 512).map(lambda w: functools.partial(make_net, w)),
    st.lists(st.integers(0, 100), max_size=4),
    st.just(make_net),
    st.just(lambda x: x),
)


@given(objects)
def test_no_value_shows_a_memory_address_and_its_text_is_stable(value):
    text = value_text(value)
    assert not ADDRESS.search(text) and len(text) <= 80
    assert value_text(value) == text  # the same every time (and in every process: no address)


@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from([0.1, 0.01, 0.001]), st.integers(1, 512)),
                min_size=1, max_size=12, unique=True))
def test_branches_with_different_choices_get_different_labels(points):
    branches = [[("t", "train_loop", {"depth": d, "lr": lr, "loop": functools.partial(make_net, w)})]
                for d, lr, w in points]
    labels = branch_labels(branches)
    assert len(set(labels)) == len(labels)
    assert all(not ADDRESS.search(label) for label in labels)
    if len(points) > 1:  # a parameter every branch shares is left out
        for name, values in (("depth", {p[0] for p in points}), ("lr", {p[1] for p in points})):
            assert (len(values) > 1) == any(f"{name}=" in label for label in labels)


# ---- the table, the JSON and the dashboard, on a real cluster ----------------------------------


def _state(client) -> dict:
    url = client.dashboard_link.rsplit("/", 1)[0] + "/quiver/api/state.json"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_loop_exploration_over_two_widths_is_labelled_by_its_widths_everywhere(client):
    import gpu
    import pipelines
    from pipelines import Pipeline, grid
    from pipelines.export import payload

    loops = [gpu.Loop(model=functools.partial(gpu.MLP, 64, 10, hidden=(w,))) for w in (8, 32)]
    node = (Pipeline("widths").source(gpu.load_digits_tensors, seed=0)
            .explore("t", grid(gpu.train_loop, loop=loops, lr=[0.001, 0.1], momentum=[0.9], epochs=[3],
                               batch_size=[32]))
            .choose("accuracy", prune=pipelines.halving(factor=2)))
    result = node.run(client, progress=False, quiet=True)
    table = result.table

    # the table: one label per branch, the widths and rates told apart, no address anywhere
    labels = list(table["label"])
    assert len(set(labels)) == 4 and not any(ADDRESS.search(t) for t in labels)
    assert {t for t in labels} == {f"loop=Loop(model=MLP(64, 10, hidden=({w},))) lr={lr}"
                                   for w in (8, 32) for lr in (0.001, 0.1)}
    assert set(table["t.loop"]) == {"Loop(model=MLP(64, 10, hidden=(8,)))", "Loop(model=MLP(64, 10, hidden=(32,)))"}
    assert str(table["t.epochs"].dtype) == "int64" and str(table["t.batch_size"].dtype) == "int64"

    # pruned rows: their last report's metrics and the rung they stopped at
    pruned = table[table["status"] == "pruned"]
    assert len(pruned) >= 1
    for i, row in pruned.iterrows():
        last = result.history[i][-1]
        assert row["accuracy"] == pytest.approx(last["accuracy"]) and row["test_loss"] == pytest.approx(last["test_loss"])
        assert row["pruned_at"] == row["iterations"] == len(result.history[i])

    # the JSON (quiver run --json)
    rows = payload(table, result.stats, compiled=result.compiled)["table"]
    text = json.dumps(rows)
    assert not ADDRESS.search(text)
    assert [r["label"] for r in rows] == labels
    assert {r["t.loop"] for r in rows} == set(table["t.loop"]) and all(isinstance(r["t.epochs"], int) for r in rows)

    # the dashboard's state (the training page's data): branches and training curves, labelled alike
    state = _state(client)
    run = next(r for r in reversed(state["runs"]) if r["name"] == "widths")
    assert [b["label"] for b in run["branches"]] == labels
    curves = run["curves"]["branches"]
    assert len({c["label"] for c in curves}) == len(curves) == 4
    training = [t for t in state["training"] if t["run"] == run["run"]]
    assert len(training) == 4 and len({t["label"] for t in training}) == 4
    assert all(t["label"].split(" ", 1)[1] in labels for t in training)
    assert not ADDRESS.search(json.dumps(run)) and not ADDRESS.search(json.dumps(training))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_integer_parameters_stay_integers_and_a_chosen_none_is_not_not_applicable(client):
    import pandas as pd

    from pipelines import Pipeline, grid
    from pipelines.export import payload
    from tests import steps

    node = Pipeline("types").source(steps.source, seed=1).explore(
        "m", grid(steps.add, n=[3, 5]), grid(steps.anything, max_depth=[None, 4], kernel=["rbf"]))
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    assert str(t["m.n"].dtype) == "Int64" and list(t["m.n"].astype(object)) == [3, 5, pd.NA, pd.NA]
    assert list(t["m.max_depth"]) == [pd.NA, pd.NA, None, 4]  # None: chosen; <NA>: does not apply
    assert isinstance(t["m.max_depth"][3], int)
    shown = t.to_string()
    assert "3.0" not in shown and "None" in shown and "<NA>" in shown
    rows = payload(t, result.stats, compiled=result.compiled)["table"]
    assert rows[0]["m.n"] == 3 and "m.max_depth" not in rows[0] and rows[2]["m.max_depth"] is None
    assert list(t["label"]) == ["m=add n=3", "m=add n=5", "m=anything max_depth=None", "m=anything max_depth=4"]
