"""A step a pruning rule's ``max_iter`` cuts short never reaches the result store (found while
building ``benchmarks/chaos.py``'s store check).

At ``max_iter`` reports an iterative step returns its *last report*, not its own value
(docs/architecture.md §7), under the same key as a run of it without the cap (wrapping does not
change keys).  Stored, that truncated value was loaded by a later run without the cap (or with a
larger one) as the step's result, and so was every value computed from it (its metric read, the
steps after it).  Such keys now neither save nor load; everything else still does.
"""

from __future__ import annotations

import graph
from graph.compiling.transform import prepare
from pipelines import Pipeline, grid, halving


def data() -> int:
    return 1


def fit(x: int, lr: float, epochs: int = 4):
    acc = 0.0
    for epoch in range(1, epochs + 1):
        acc = round(lr * epoch / 10, 6)
        yield {"accuracy": acc}
    return {"accuracy": acc, "lr": lr, "trained_epochs": epochs}


def evaluate(model: dict) -> dict:
    return dict(model, evaluated=True)


def exploration(cap: int | None):
    node = Pipeline("capped").source(data).explore("fit", grid(fit, lr=[1.0, 2.0]))
    return node.choose("accuracy", prune=halving(factor=2, max_iter=cap) if cap else None).then(evaluate)


def test_capped_steps_and_what_is_computed_from_them_neither_save_nor_load(tmp_path):
    capped = graph.compile(exploration(2))
    run = prepare(capped, store=tmp_path)
    fits = {k for k, t in capped.graph.items() if "fit" in k}
    assert fits and not fits & run.saving
    downstream = {k for k in (*capped.graph, *capped.metric_graph) if k not in fits and k not in run.saving}
    assert downstream  # evaluate and the metric reads of the capped branches
    assert any(k.startswith("data") for k in run.saving)  # upstream of the cap: stored as before
    uncapped = prepare(graph.compile(exploration(None)), store=tmp_path)
    assert fits <= uncapped.saving  # the same keys, saved when nothing cuts them short


def test_a_run_without_the_cap_does_not_load_the_capped_value(client, tmp_path):
    store = tmp_path / "store"
    first = exploration(2).run(client, store=str(store), progress=False, quiet=True)
    assert first.value == {"accuracy": 0.4, "evaluated": True}  # evaluated: the last report at the cap
    second = exploration(None).run(client, store=str(store), progress=False, quiet=True)
    assert second.value == {"accuracy": 0.8, "lr": 2.0, "trained_epochs": 4, "evaluated": True}
    third = exploration(None).run(client, store=str(store), progress=False, quiet=True)
    assert third.value == second.value and third.stats["loaded_from_store"] > 0  # uncapped results reused
