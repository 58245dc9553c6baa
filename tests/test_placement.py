"""Placement (benchmarks/placement.py, what benchmarks/explore_vs_naive.py's variant a' installs): which results are shared and which workers fetch a copy (pure, literal inputs and
hypothesis), and the scheduler plugin on a real cluster: the copies really appear."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import graph
from pipelines import Pipeline, grid
from tests import steps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # as the benchmark runs
from placement import ReplicateShared, install, remove, replica_targets, shared_results  # noqa: E402


def test_shared_results_counts_distinct_consumers():
    deps = {"src": ["a", "b", "b"], "a": ["x"], "b": [], "x": []}
    assert shared_results(deps) == {"src": 2}
    assert shared_results(deps, min_consumers=3) == {}
    with pytest.raises(ValueError, match="min_consumers must be at least 2"):
        shared_results(deps, min_consumers=1)


@given(
    workers=st.lists(st.sampled_from("abcdef"), min_size=1, max_size=8),
    holder=st.sampled_from("abcdef"),
    consumers=st.integers(0, 10),
    load=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 5)),
)
def test_replica_targets_never_the_holder_at_most_one_per_other_consumer_least_busy_first(workers, holder, consumers, load):
    targets = replica_targets(holder, workers, consumers, load)
    assert holder not in targets and len(set(targets)) == len(targets)
    assert set(targets) <= set(workers)
    assert len(targets) == min(max(0, consumers - 1), len(set(workers) - {holder}))
    left_out = set(workers) - {holder} - set(targets)
    assert all(load.get(t, 0) <= load.get(w, 0) for t in targets for w in left_out)


def test_a_prefix_read_by_several_branches_is_copied_to_the_other_worker(client):
    src = Pipeline("placement").source(steps.source, seed=3)
    node = src.explore("a", grid(steps.add, n=[1, 2, 3])).choose("x", k=3)
    compiled = graph.compile(node)
    (source_key,) = [k for k in compiled.graph if k.startswith("source-")]
    assert shared_results(compiled.dependents) == {source_key: 3}
    name = install(client, compiled)
    assert name is not None and name in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    try:
        result = node.run(client, progress=False, quiet=True)
    finally:
        requested = remove(client, name)
    assert sorted(v["x"] for v in result.values) == [4, 5, 6]
    workers = sorted(client.scheduler_info()["workers"])
    assert list(requested) == [source_key] and len(requested[source_key]) == 1 and requested[source_key][0] in workers
    assert name not in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))


def test_nothing_to_place_installs_nothing(client):
    node = Pipeline("single").source(steps.source, seed=4).then(steps.square)
    assert install(client, graph.compile(node)) is None and remove(client, None) == {}


def test_plugin_asks_the_least_busy_other_worker(monkeypatch):
    """The plugin's scheduler side, on literal scheduler state (no cluster)."""
    from types import SimpleNamespace as NS

    asked = []
    holder = NS(address="tcp://a")
    sched = NS(
        tasks={"src": NS(who_has=[holder])},
        workers={"tcp://a": NS(processing={}), "tcp://b": NS(processing={1: 1}), "tcp://c": NS(processing={})},
        request_acquire_replicas=lambda addr, keys, stimulus_id: asked.append((addr, keys)),
    )
    plugin = ReplicateShared("p", {"src": 2})
    plugin._scheduler = sched
    plugin.transition("src", "waiting", "processing")
    plugin.transition("other", "processing", "memory")
    assert asked == []
    plugin.transition("src", "processing", "memory")
    assert asked == [("tcp://c", ["src"])] and plugin.requested == {"src": ["tcp://c"]}
