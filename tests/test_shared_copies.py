"""Shared inputs of training copied to every worker as soon as they exist (graph/run/sharedcopies.py,
issue 23 point 2): the pure rules on literal and generated inputs, the plugin's scheduler side on
literal scheduler state, and a real run on 2 worker processes with evidence from the workers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import graph
from graph.run.sharedcopies import COPY_STIMULUS, CopyShared, copy_targets, shared_inputs, training_keys
from pipelines import Pipeline, grid, halving
from tests import shared_steps, steps


def test_shared_inputs_count_training_readers_only_and_never_copy_under_a_budget():
    deps = {"src": {"t1", "t2", "prep"}, "prep": {"t3"}, "t1": set(), "t2": set(), "t3": set(), "other": {"x", "y"}}
    assert shared_inputs(deps, training={"t1", "t2", "t3"}) == {"src": 3}  # read by 3 tasks, 2 of them training
    assert shared_inputs(deps, training={"t1", "t2", "t3"}, min_readers=3) == {}
    assert shared_inputs(deps, training={"t1", "t2", "t3"}, budgeted=True) == {}
    with pytest.raises(ValueError, match="min_readers must be at least 2"):
        shared_inputs(deps, training=set(), min_readers=1)


@given(
    workers=st.lists(st.sampled_from("abcdef"), min_size=1, max_size=8),
    holder=st.sampled_from("abcdef"),
    readers=st.integers(0, 10),
    load=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 5)),
)
def test_copy_targets_every_other_worker_up_to_one_per_other_reader_least_busy_first(workers, holder, readers, load):
    targets = copy_targets(holder, workers, readers, load)
    assert holder not in targets and len(set(targets)) == len(targets) and set(targets) <= set(workers)
    assert len(targets) == min(max(0, readers - 1), len(set(workers) - {holder}))
    left_out = set(workers) - {holder} - set(targets)
    assert all(load.get(t, 0) <= load.get(w, 0) for t in targets for w in left_out)


def test_training_keys_are_the_iterative_steps_of_a_compiled_run():
    node = (Pipeline("t").source(shared_steps.load_data, log_dir="/nowhere")
            .explore("fit", grid(shared_steps.train, log_dir=["/nowhere"], lr=[0.1, 1.0])).choose("accuracy"))
    compiled = graph.compile(node)
    keys = training_keys(compiled)
    assert len(keys) == 2 and all(k.startswith("train-") for k in keys)
    (src,) = [k for k in compiled.graph if k.startswith("load_data-")]
    assert shared_inputs(compiled.dependents, keys) == {src: 2}
    plain = graph.compile(Pipeline("p").source(steps.source, seed=3).explore("a", grid(steps.add, n=[1, 2, 3])))
    assert training_keys(plain) == set() and shared_inputs(plain.dependents, training_keys(plain)) == {}


def test_plugin_copies_once_to_the_least_busy_other_worker_also_for_a_recompute_copy():
    """The plugin's scheduler side, on literal scheduler state (no cluster)."""
    from types import SimpleNamespace as NS

    asked = []
    holder = NS(address="tcp://a")
    sched = NS(
        tasks={"src~again1": NS(who_has=[holder]), "src": NS(who_has=[holder])},
        workers={"tcp://a": NS(processing={}), "tcp://b": NS(processing={1: 1}), "tcp://c": NS(processing={})},
        request_acquire_replicas=lambda addr, keys, stimulus_id: asked.append((addr, keys, stimulus_id)),
    )
    plugin = CopyShared("p", {"src": 2})
    plugin._scheduler = sched
    plugin.transition("src", "waiting", "processing")
    plugin.transition("other", "processing", "memory")
    assert asked == []
    plugin.transition("src~again1", "processing", "memory")  # a recompute copy of the key is its value too
    assert [(a, k) for a, k, _ in asked] == [("tcp://c", ["src~again1"])] and asked[0][2].startswith(COPY_STIMULUS)
    plugin.transition("src", "processing", "memory")  # once per key
    assert len(asked) == 1 and plugin.requested == {"src": ["tcp://c"]}


def _source_story(dask_worker, key: str) -> dict:
    """On a worker: when ``key`` came into its memory, and the stimulus that first brought it there."""
    memory_at, first_stimulus, computed = None, None, False
    for entry in dask_worker.state.log:
        if len(entry) != 7 or entry[0] != key:  # transitions: (key, start, finish, final, recs, stimulus, time)
            continue
        _, start, _, final, _, stimulus, at = entry
        if first_stimulus is None:
            first_stimulus = stimulus
        computed = computed or start == "executing"
        if final == "memory" and memory_at is None:
            memory_at = at
    return {"memory_at": memory_at, "stimulus": first_stimulus, "computed": computed}


def _copy_plugins(dask_scheduler) -> list:
    return [n for n in dask_scheduler.plugins if n.startswith("quiver-copies-")]


@pytest.mark.slow
def test_every_worker_holds_the_shared_source_before_its_first_training_task_and_the_source_runs_once(
        client, log_dir):
    node = (Pipeline("shared").source(shared_steps.load_data, log_dir=log_dir)
            .explore("fit", grid(shared_steps.train, log_dir=[log_dir], lr=[0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0]))
            .choose("accuracy", prune=halving(factor=3, min_iter=1)))
    compiled = graph.compile(node)
    (src,) = [k for k in compiled.graph if k.startswith("load_data-")]
    result = node.run(client, progress=False, quiet=True)

    assert len(shared_steps.notes(log_dir, "source")) == 1  # the user's source ran once, copies moved data only
    workers = sorted(client.nthreads())
    stories = client.run(_source_story, key=src)
    (holder,) = [w for w, s in stories.items() if s["computed"]]
    (other,) = [w for w in workers if w != holder]
    assert result.stats["shared_copies"] == {src: [other]}
    # the other worker's copy came from the library's request, not from a training task's fetch
    assert str(stories[other]["stimulus"]).startswith(COPY_STIMULUS), stories[other]
    trained = shared_steps.notes(log_dir, "train")
    assert {n["worker"] for n in trained} == set(workers), "both workers should train"
    for w in workers:
        first = min(n["at"] for n in trained if n["worker"] == w)
        assert stories[w]["memory_at"] is not None and stories[w]["memory_at"] <= first, (w, stories[w], first)
    assert client.run_on_scheduler(_copy_plugins) == []  # removed at the run's end


@pytest.mark.slow
def test_the_copy_plugin_is_removed_when_the_run_fails(client, log_dir):
    node = (Pipeline("shared-broken").source(shared_steps.load_data, log_dir=log_dir, seconds=0.0)
            .explore("fit", grid(shared_steps.broken_train, log_dir=[log_dir], lr=[0.1, 0.3, 1.0])).choose("accuracy"))
    with pytest.raises(graph.RunError):
        node.run(client, progress=False, quiet=True)
    assert client.run_on_scheduler(_copy_plugins) == []


def test_turned_off_by_dask_config_before_asking_the_scheduler_anything():
    import dask

    from graph.run.sharedcopies import install

    node = (Pipeline("off").source(shared_steps.load_data, log_dir="/nowhere")
            .explore("fit", grid(shared_steps.train, log_dir=["/nowhere"], lr=[0.1, 1.0])).choose("accuracy"))
    with dask.config.set({"quiver.shared-copies": False}):
        assert install(None, graph.compile(node)) is None  # no client call: None would fail it
