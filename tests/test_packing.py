"""Packing training branches: gpu.packing (the packed trainer, its member tuner) and
graph.compiling.packing (packed tasks in a compiled run), with real torch on the real digits, and a
real LocalCluster with worker processes for the reports and rung answers per member key."""

from __future__ import annotations

import functools
import queue
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu
import pipelines
from gpu.packing import PackedTrainer, tune_members
from graph.tasks.iterative import WAIT_TOPIC, ReportChannel
from graph.compiling.packing import pack_compiled, packable_groups, packed_train
from graph.state.halving import Halving, Pruned, Stop
from graph.spec import PruneSpec
from pipelines import Pipeline, grid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # slow: packed training groups, a killed worker

MLP = functools.partial(gpu.MLP, 64, 10, hidden=(16,))
WAIT = 120
SHARED = dict(batch_size=32, replicas=2, epochs=2)
MEMBERS = {
    "a": dict(lr=0.05, seed=0),
    "b": dict(lr=0.2, seed=1, momentum=0.5),
    "c": dict(lr=0.01, seed=2, weight_decay=0.0, alpha=0.3, epochs=3),
}
CURVE = ("epoch", "train_loss", "test_loss", "accuracy", "lr", "spread")


@pytest.fixture(scope="module")
def digits():
    return gpu.load_digits_tensors(seed=0)


@pytest.fixture(scope="module")
def solo(digits):
    """Each member trained alone by gpu.train (workers=1: in this process)."""
    return {name: gpu.train(digits, model=MLP, workers=1, **{**SHARED, **params})
            for name, params in MEMBERS.items()}


def curve(history):
    return [[h[k] for k in CURVE] for h in history]


def assert_same_curves(packed, alone):
    assert len(packed) == len(alone)
    for p, s in zip(curve(packed), curve(alone)):
        assert p == pytest.approx(s, rel=1e-5, abs=1e-6)


# ---- the packed trainer, in this process ---------------------------------------------------------
def test_a_packed_member_reports_what_its_solo_run_reports(digits, solo):
    results = PackedTrainer(digits, MLP, MEMBERS, **SHARED).run()
    assert sorted(results) == ["a", "b", "c"]
    for name in MEMBERS:
        assert_same_curves(results[name]["history"], solo[name]["history"])
        assert results[name]["accuracy"] == pytest.approx(solo[name]["accuracy"], abs=1e-6)
        assert results[name]["packed"] == 3
        z_p = gpu.ParamLayout(results[name]["model"]).flatten(results[name]["model"])
        z_s = gpu.ParamLayout(solo[name]["model"]).flatten(solo[name]["model"])
        assert (z_p - z_s).abs().max().item() < 1e-5


def test_a_removed_member_leaves_the_others_reports_unchanged(digits, solo):
    pack = PackedTrainer(digits, MLP, MEMBERS, **SHARED)
    first = pack.epoch()
    assert sorted(first) == ["a", "b", "c"] and all(r["members"] == 3 for r in first.values())
    pack.remove("b")
    later = []
    while pack.active:
        later.append(pack.epoch())
    assert [sorted(r) for r in later] == [["a", "c"], ["c"]]  # a ends after 2 epochs, c after 3
    for name in ("a", "c"):
        assert_same_curves(pack.result(name)["history"], solo[name]["history"])
    with pytest.raises(ValueError, match="not finished"):
        pack.result("b")


def test_waiting_members_join_as_places_free_and_still_match_their_solo_runs(digits, solo):
    pack = PackedTrainer(digits, MLP, MEMBERS, active=2, **SHARED)
    assert pack.active == ["a", "b"] and pack.waiting == ["c"]
    first = pack.epoch()
    assert sorted(first) == ["a", "b"]
    pack.remove("a")  # c takes a's place, from its own seeded start
    assert pack.active == ["b", "c"]
    results = pack.run()
    assert sorted(results) == ["b", "c"]
    for name in ("b", "c"):
        assert_same_curves(results[name]["history"], solo[name]["history"])


@pytest.mark.parametrize("algorithm", ["sma", "ssgd"])
def test_a_member_moved_to_another_packed_trainer_goes_on_as_if_it_had_stayed(digits, algorithm):
    """snapshot() in one PackedTrainer, add(resume=...) in another (a take-over's move): the moved
    member's replica rows, central model, SMA state, batch order and learning rate (a drop after
    the move included) go on as in its solo run; the trainer it left goes on unchanged."""
    shared = dict(batch_size=32, replicas=2, epochs=5, lr_drops=(3,), algorithm=algorithm)
    members = {"a": dict(lr=0.1, seed=0, momentum=0.9), "b": dict(lr=0.05, seed=1)}
    old = PackedTrainer(digits, MLP, members, **shared)
    for _ in range(2):
        old.epoch()
    state = old.snapshot("a")
    old.remove("a")
    left = old.run()
    new = PackedTrainer(digits, MLP, {"c": dict(lr=0.2, seed=3)}, **shared)
    new.add("a", members["a"], resume=state)
    moved = new.run()
    assert [h["epoch"] for h in moved["a"]["history"]] == [1, 2, 3, 4, 5]
    for name, result in (("a", moved["a"]), ("b", left["b"])):
        alone = PackedTrainer(digits, MLP, {name: members[name]}, **shared).run()[name]
        assert_same_curves(result["history"], alone["history"])
    assert PackedTrainer(digits, MLP, members, active=1, **shared).snapshot("b") is None  # waiting: nothing to move
    with pytest.raises(ValueError, match="not members"):
        PackedTrainer(digits, MLP, members, resume={"zz": state}, **shared)

    class Seeded(PackedTrainer):  # a trainer that cannot hand members over refuses a snapshot with the reason
        resumes = False

    with pytest.raises(ValueError, match="cannot resume"):
        Seeded(digits, MLP, members, **shared).add("c", dict(lr=0.1), resume=state)
    with pytest.raises(ValueError, match="cannot resume"):
        Seeded(digits, MLP, members, resume={"a": state}, **shared)


def test_auto_members_are_tuned_on_a_scratch_group_without_changing_training(digits, solo):
    pack = PackedTrainer(digits, MLP, MEMBERS, active="auto", **SHARED)
    counts = [m for m, _ in pack.tuning]
    assert counts[0] == 1 and counts == list(range(1, len(counts) + 1)) and 1 <= pack.active_limit <= 3
    results = pack.run()
    for name in MEMBERS:
        assert_same_curves(results[name]["history"], solo[name]["history"])


def test_bad_members_are_refused_with_the_fix(digits):
    with pytest.raises(ValueError, match="cannot differ inside a packed group"):
        PackedTrainer(digits, MLP, {"a": {"batch_size": 8}}, **SHARED)
    with pytest.raises(ValueError, match="whole number"):
        PackedTrainer(digits, MLP, {"a": {}}, batch_size=32, replicas="auto")
    with pytest.raises(ValueError, match="members is empty"):
        PackedTrainer(digits, MLP, {}, **SHARED)


# ---- the member tuner (pure) ---------------------------------------------------------------------
def test_member_tuner_on_literal_curves():
    assert tune_members({1: 100.0, 2: 111.0, 3: 120.0}.__getitem__, most=3) == (2, [(1, 100.0), (2, 111.0), (3, 120.0)])
    assert tune_members({1: 100.0, 2: 110.0}.__getitem__, most=5)[0] == 1  # +10% exactly: not more than 10%
    assert tune_members({1: 100.0, 2: 300.0, 3: 305.0}.__getitem__, most=8) == (2, [(1, 100.0), (2, 300.0), (3, 305.0)])
    assert tune_members(lambda m: 100.0 * m, most=4) == (4, [(m, 100.0 * m) for m in range(1, 5)])
    with pytest.raises(ValueError, match="most"):
        tune_members(float, most=0)


def rule(rates: list[float], threshold: float) -> int:
    """A literal transcription: keep adding while the new rate beats the best so far by > threshold."""
    best, best_rate = 1, rates[0]
    for m, r in enumerate(rates[1:], start=2):
        if r > best_rate * (1 + threshold):
            best, best_rate = m, r
        else:
            break
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 1e6), min_size=1, max_size=8), st.sampled_from([0.0, 0.05, 0.1, 0.3]))
def test_member_tuner_follows_crossbows_rule(rates, threshold):
    best, curve_ = tune_members(lambda m: rates[m - 1], most=len(rates), threshold=threshold)
    assert best == rule(rates, threshold)
    assert [m for m, _ in curve_] == list(range(1, len(curve_) + 1))  # measured 1, 2, ... in order
    assert len(curve_) == min(best + 1, len(rates))  # stops at the first count that did not pay


def test_packed_ssgd_members_match_their_solo_runs(digits):
    """S-SGD members (their k rows at one model, gradients averaged) report what their solo
    gpu.train(algorithm="ssgd") runs report."""
    shared = dict(SHARED, algorithm="ssgd")
    members = {n: {k: v for k, v in p.items() if k != "alpha"} for n, p in MEMBERS.items()}
    results = PackedTrainer(digits, MLP, members, **shared).run()
    for name, params in members.items():
        alone = gpu.train(digits, model=MLP, workers=1, **{**shared, **params})
        assert_same_curves(results[name]["history"], alone["history"])
        assert all(h["spread"] == 0.0 for h in results[name]["history"])  # the rows never part


# ---- graph side: which branches pack -------------------------------------------------------------
def explore(**overrides):
    params = dict(model=[MLP], lr=[0.01, 0.1], seed=[0], epochs=[2], batch_size=[32], replicas=[1], workers=[1])
    params.update(overrides)
    return Pipeline("digits").source(gpu.load_digits_tensors, seed=0).explore("t", grid(gpu.train, **params))


def test_a_members_horizon_is_the_epochs_its_trainer_trains(digits):
    """The take-over rule (graph/state/claims.py) plans with each member's most epochs: for a
    member that does not say, the epochs its packed trainer gives it (gpu.train's 5, not 1)."""
    from gpu.loops import PackedLoop
    from graph.compiling.packing import _horizon, _trainer_kind

    _, _, default = _trainer_kind("train")
    trained = PackedTrainer(digits, MLP, {"a": {"lr": 0.1}}, batch_size=32, replicas=1).configs["a"].epochs
    assert _horizon({"lr": 0.1}, {"batch_size": 32}, None, default) == trained == 5
    _, _, default = _trainer_kind("loop")
    loop = gpu.Loop(model=MLP)
    trained = PackedLoop(digits, loop, {"a": {"lr": 0.1}}, batch_size=32).configs["a"]["epochs"]
    assert _horizon({"lr": 0.1}, {"batch_size": 32}, None, default) == trained == 10
    assert _horizon({"lr": 0.1}, {}, PruneSpec(factor=3, min_iter=1, max_iter=3), default) == 3


def test_packable_groups_follow_the_rule():
    assert [len(g) for g in packable_groups(explore().compile().graph)] == [2]
    # the members' own parameters may differ; what is trained otherwise may not
    assert [len(g) for g in packable_groups(explore(momentum=[0.5, 0.9], alpha=[0.1, 0.3]).compile().graph)] == [8]
    assert [len(g) for g in packable_groups(explore(batch_size=[16, 32]).compile().graph)] == [2, 2]
    assert packable_groups(explore(replicas=["auto"]).compile().graph) == []  # tunes a solo run
    assert [len(g) for g in packable_groups(explore(algorithm=["sma", "ssgd"]).compile().graph)] == [2, 2]
    assert packable_groups(explore(workers=[None]).compile().graph) == []  # a gang over the cluster
    assert packable_groups(explore(lr=[0.1]).compile().graph) == []  # one branch: nothing to pack


def test_graphs_with_collection_nodes_are_scanned_for_packing():
    """Dask collections put Alias and DataNode entries (no ``func``) beside tasks in the graph:
    the packing scan skips them (it raised AttributeError on the big-table example)."""
    from dask.task_spec import Alias, DataNode

    graph = dict(explore().compile().graph)
    graph["an-alias"] = Alias("an-alias", next(iter(graph)))
    graph["a-datanode"] = DataNode("a-datanode", 3)
    assert [len(g) for g in packable_groups(graph)] == [2]


def test_pack_compiled_keeps_member_keys_and_puts_the_packed_tasks_in_their_lineage():
    compiled = explore(lr=[0.01, 0.03, 0.1]).choose("accuracy").compile()
    members = [b.key for b in compiled.chooses[0].inputs]
    pack_compiled(compiled, slots=2, run="r")
    packs = list(compiled.packed)
    # two packed tasks (one per worker thread), each able to train any member: they claim at run time
    assert len(packs) == 2 and all(sorted(compiled.packed[p]) == sorted(members) for p in packs)
    assert compiled.claim_tables == ["r-0"]
    for b in compiled.chooses[0].inputs:
        assert b.lineage[-3:] == (*packs, b.key)
        assert compiled.graph[b.key].dependencies == set(packs)
        assert all(b.key in compiled.dependents[p] for p in packs)
    assert all(compiled.graph[p].func is packed_train for p in packs)
    assert {compiled.graph[p].kwargs["claims"] for p in packs} == {"r-0"}
    assert pack_compiled(explore(lr=[0.01, 0.03]).compile(), slots=4).packed.keys().__len__() == 2  # <= members
    # given the workers (one address per thread), the packs are as many and each goes to its own thread
    placed = pack_compiled(explore(lr=[0.01, 0.03, 0.1]).compile(), workers=["w0", "w1"])
    assert len(placed.packed) == 2 and sorted(placed.placement.values()) == ["w0", "w1"]
    with pytest.raises(ValueError, match="give slots"):
        pack_compiled(explore(lr=[0.01, 0.03]).compile())


def test_run_refuses_a_bad_pack_option():
    with pytest.raises(pipelines.PipelineError, match="pack must be True"):
        explore().choose("accuracy").run(pack="yes")


# ---- on a real cluster -------------------------------------------------------------------------------
def test_packed_task_reports_and_waits_per_member_key_and_drops_pruned_members(client, digits):
    """The packed task speaks for each member key: reports arrive under it, its gate answers
    it; the rule's losers come back Pruned at their rung, the others train to their end with
    the reports their solo runs make."""
    prune = PruneSpec(factor=3, min_iter=1)  # rungs at 1, 3
    keys = {"m-a": 0, "m-b": 1, "m-c": 2}
    members = {k: MEMBERS[n] for k, n in zip(keys, "abc")}
    halving = Halving(prune)
    events: queue.Queue = queue.Queue()
    channel = ReportChannel(client, lambda key, i, report: events.put((key, i, report)), keys=set(keys))
    log = []
    try:
        fut = client.submit(packed_train, digits, model=MLP, members=members, shared=SHARED,
                            prunes={k: prune for k in keys}, active=None, key="packed-test", pure=False)
        while not fut.done() or not events.empty():
            try:
                key, i, report = events.get(timeout=0.2)
            except queue.Empty:
                continue
            log.append((key, i, report))
            if prune.rung_of(i) is not None:
                decision = halving.report(keys[key], None, i, report["accuracy"])
                if isinstance(decision, Stop) and decision.pruned:
                    channel.stop(key, i)
                else:
                    channel.resume(key, i)
        values = fut.result(timeout=WAIT)
    finally:
        channel.close()
    pruned = {k for k in keys if halving.stopped(keys[k]) is not None and halving.stopped(keys[k]).pruned}
    assert pruned  # three branches at rung 1: only the best continues past it
    # the members' waits for those answers held the packed task's thread: sent under its own key
    # (graph.report.breakdown counts them as waiting, graph.run.monitor leaves them out of its compute)
    waits = [m for _, m in client.get_events(WAIT_TOPIC) if m.get("key") == "packed-test"]
    assert len(waits) == 1 and waits[0]["seconds"] > 0 and "released" not in waits[0]
    assert sum(b - a for a, b in waits[0]["spans"]) == pytest.approx(waits[0]["seconds"], rel=0.05, abs=0.01)
    alone = {k: PackedTrainer(digits, MLP, {k: members[k]}, **SHARED).run()[k] for k in keys}
    for k in keys:
        mine = [r for key, _, r in log if key == k]
        assert [i for key, i, _ in log if key == k] == list(range(1, len(mine) + 1))
        if k in pruned:
            stop = halving.stopped(keys[k])
            assert isinstance(values[k], Pruned) and values[k].iterations == stop.iteration == len(mine)
        else:
            assert not isinstance(values[k], Pruned)
            assert_same_curves(values[k]["history"], alone[k]["history"])
            assert [r["accuracy"] for r in mine] == [h["accuracy"] for h in values[k]["history"]]


def test_a_packed_task_the_run_releases_says_how_long_it_ran(client, digits):
    """Dask's task stream keeps no record of a task released while it ran: the packed task sends
    its own span (``released``) with its rung waits, for the run's time breakdown."""
    prune = PruneSpec(factor=3, min_iter=1)
    keys = ("r-a", "r-b")
    members = {k: dict(MEMBERS[n], epochs=30) for k, n in zip(keys, "ab")}
    reports: queue.Queue = queue.Queue()
    channel = ReportChannel(client, lambda key, i, report: reports.put((key, i)), keys=set(keys))
    try:
        fut = client.submit(packed_train, digits, model=MLP, members=members, shared=dict(SHARED, epochs=30),
                            prunes={k: prune for k in keys}, active=None, key="packed-released", pure=False)
        key, i = reports.get(timeout=WAIT)  # training: the first member's first report (a rung)
        channel.resume(key, i)
        started = time.time()
        fut.release()  # the run lets it go (a pruned group, a cancelled branch)
        deadline = time.monotonic() + WAIT
        mine: list = []
        while not mine and time.monotonic() < deadline:
            mine = [m for _, m in client.get_events(WAIT_TOPIC) if m.get("key") == "packed-released"]
            time.sleep(0.05)
    finally:
        channel.close()
    assert len(mine) == 1 and "released" in mine[0]
    a, b = mine[0]["released"]
    assert a < started <= b  # from the task's start to after the release: what it ran
    assert mine[0]["worker"] in client.scheduler_info()["workers"]


def test_a_packed_run_chooses_what_an_unpacked_run_chooses(client):
    node = explore(lr=[0.01, 0.05, 0.2]).choose("accuracy")
    members = {b.key for b in node.compile().chooses[0].inputs}

    def ends():  # per member key, the training "end" events on the dashboard's topic so far
        return Counter(m["task"] for _, m in client.get_events("quiver-training")
                       if m.get("kind") == "end" and m.get("task") in members)

    before = ends()
    packed = node.run(client, pack=True, progress=False, quiet=True)
    # each member's curve went to the dashboard under its own key, as a solo gpu.train's does
    deadline = time.monotonic() + WAIT
    while any(ends()[k] <= before[k] for k in members) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(ends()[k] > before[k] for k in members)
    alone = node.run(client, pack=False, progress=False, quiet=True)
    assert list(packed.table["accuracy"]) == pytest.approx(list(alone.table["accuracy"]), abs=1e-6)
    assert packed.value["accuracy"] == pytest.approx(alone.value["accuracy"], abs=1e-6)
    assert "packed" in packed.table and "packed" not in alone.table  # members at once: as tuned (>= 1)
    assert (packed.stats["packed_groups"], packed.stats["packed_branches"]) == (2, 3)  # 3 branches, 2 threads
    assert "packed_groups" not in alone.stats

def test_packed_tasks_claim_members_at_run_time(client, digits):
    """A group's packed tasks share its members through one claim table (graph/state/claims.py): a
    pack alone trains every member, one at a time, though its fair share was half (static
    dealing gave it two); a pack starting after it finds nothing left and ends at once. Run
    together, the two take every member exactly once."""
    members = {f"c-{i}": dict(lr=lr, seed=i) for i, lr in enumerate((0.05, 0.1, 0.2, 0.02))}
    prunes = {k: None for k in members}
    shared = dict(SHARED, epochs=1)

    def submit(key, table):
        return client.submit(packed_train, digits, model=MLP, members=members, shared=shared, prunes=prunes,
                             active=1, claims=table, packs=("pk-0", "pk-1"), key=key, pure=False)

    first = submit("pk-0", "claims-alone").result(timeout=WAIT)
    assert sorted(first) == sorted(members) and all(v["packed"] == 1 for v in first.values())
    assert submit("pk-1", "claims-alone").result(timeout=WAIT) == {}
    both = client.gather([submit("pk-0", "claims-both"), submit("pk-1", "claims-both")])
    assert sorted(k for r in both for k in r) == sorted(members)  # each member once, by one pack
    for k, v in {k: v for r in both for k, v in r.items()}.items():  # where it trained changes nothing
        assert_same_curves(v["history"], first[k]["history"])


def _import_packing():
    import gpu.packing  # noqa: F401


def test_an_idle_packed_task_takes_a_member_over_and_moves_it(client, digits):
    """A packed task that starts when its group's other packed task holds every member takes one
    over (graph/state/claims.py: the least trained); the other hands the member's state over at its
    next epoch (gpu.PackedTrainer.snapshot: its replica rows, central model, SMA state, batch order)
    and the taker goes on from there. Each member ends in exactly one result, with its solo run's
    curve; every iteration reaches the run once and none is sent twice."""
    members = {"t-a": dict(lr=0.05, seed=0), "t-b": dict(lr=0.2, seed=1, momentum=0.5)}
    shared = dict(SHARED, epochs=20)
    prunes = {k: None for k in members}
    client.run(_import_packing)  # the second task's worker must not spend its first seconds importing torch

    def submit(key):
        return client.submit(packed_train, digits, model=MLP, members=members, shared=shared, prunes=prunes,
                             active=2, claims="tk", packs=("tk-0", "tk-1"), key=key, pure=False)

    from tests.rule_check import run_a_late_second_pack

    values, delivered, table, replayed = run_a_late_second_pack(client, submit, "tk", members, 20, wait=WAIT)
    assert len(table["takeovers"]) == 1
    taken, old, new, made = table["takeovers"][0]
    assert (taken, old, new) == ("t-b", "tk-0", "tk-1") and made >= 1
    assert sorted(values[0]) == ["t-a"] and sorted(values[1]) == ["t-b"]  # each member in one result
    assert replayed == 0  # moved, not retrained: nothing was sent twice
    for k in members:  # every iteration delivered once, in order
        assert [i for key, i in delivered if key == k] == list(range(1, 21))
    alone = {k: PackedTrainer(digits, MLP, {k: members[k]}, **shared).run()[k] for k in members}
    result = {**values[0], **values[1]}
    for k in members:
        assert_same_curves(result[k]["history"], alone[k]["history"])


def test_a_worker_killed_during_a_packed_pruning_exploration(tmp_path):
    """SIGKILL the worker whose packed task has just reported: Dask reruns that packed task,
    which takes back the members it had claimed (graph/state/claims.py) and retrains them from their
    seeds; their replayed reports are not counted again, the rule holds on the run's arrivals,
    every branch's history runs 1..n once and equals a prefix of its run alone, and the chosen
    branch is the best of those that finished."""
    from tests.rule_check import check_rule, run_killing_a_reporting_pack

    grid_ = explore(lr=[0.01, 0.03, 0.05, 0.1, 0.0003, 0.0001], epochs=[9])
    result, alone, killed = run_killing_a_reporting_pack(grid_.choose("accuracy", prune=pipelines.halving(factor=3)),
                                                         grid_.choose("accuracy"))
    assert killed, "every packed task ended before a worker could be killed"
    check_rule(result, factor=3)
    assert result.stats["packed_groups"] == 2 and result.stats["reports_replayed"] > 0
    assert result.stats["reports"] == result.table["iterations"].sum()  # no report counted twice
    for h, full in zip(result.history, alone.history):
        assert [r["epoch"] for r in h] == list(range(1, len(h) + 1))
        assert [r["accuracy"] for r in h] == pytest.approx([r["accuracy"] for r in full[:len(h)]], abs=1e-6)
    finished = result.table[result.table["status"] == "ok"]
    assert result.value["accuracy"] == pytest.approx(finished["accuracy"].max())


def cuda_mlp():
    return MLP().cuda()


@pytest.mark.gpu
def test_a_packed_member_matches_its_solo_run_on_a_gpu(digits):
    """The same claim on a CUDA device (batched kernels may round differently: a looser bound)."""
    shared = dict(SHARED, epochs=2)
    results = PackedTrainer(digits, cuda_mlp, MEMBERS, **shared).run()
    for name, params in MEMBERS.items():
        alone = gpu.train(digits, model=cuda_mlp, workers=1, **{**shared, **params})
        for p, s in zip(curve(results[name]["history"]), curve(alone["history"])):
            assert p == pytest.approx(s, rel=1e-3, abs=1e-4)


def test_a_pruning_run_prunes_packed_members_at_rungs_and_the_others_keep_their_curves(client):
    """Pruning and packing together through run(): reports reach the state machine under the
    member keys, pruned members stop at a rung of the rule with the curve they would have
    had alone, and the chosen branch is the best of those that finished."""
    node = explore(lr=[0.003, 0.01, 0.05, 0.2, 1.0], epochs=[3])
    pruned_run = node.choose("accuracy", prune=pipelines.halving(factor=3)).run(
        client, pack=True, progress=False, quiet=True)
    full = node.choose("accuracy").run(client, pack=False, progress=False, quiet=True)
    table = pruned_run.table
    assert set(table["status"]) <= {"ok", "pruned"} and (table["status"] == "pruned").any()
    rungs = {1, 3}
    for row, status in enumerate(table["status"]):
        mine, alone = pruned_run.history[row], full.history[row]
        assert [r["accuracy"] for r in mine] == pytest.approx([r["accuracy"] for r in alone[:len(mine)]], abs=1e-6)
        if status == "pruned":
            # stopped at a rung (3, its last epoch, is a rung too: a loser there is pruned, as a solo step is)
            assert table["iterations"].iloc[row] in rungs and len(mine) == table["iterations"].iloc[row]
        else:
            assert len(mine) == 3
    finished = table[table["status"] == "ok"]
    assert pruned_run.value["accuracy"] == pytest.approx(finished["accuracy"].max())
    # its members' rung waits (round trips to the run) show in the time breakdown, out of computing
    assert pruned_run.stats["time_breakdown"]["waiting"] > 0


def test_no_take_over_while_other_tasks_wait_for_the_workers_thread():
    """The scheduler-side check a claim makes before a take-over: a packed task whose worker has
    more tasks assigned than threads (another group's packed task waits) ends instead."""
    from types import SimpleNamespace as NS

    from graph.compiling.packing import _others_wait

    def scheduler(assigned, threads):
        worker = NS(processing=dict.fromkeys(assigned), nthreads=threads)
        return NS(tasks={"pack": NS(processing_on=worker), "gone": NS(processing_on=None)})

    assert _others_wait(scheduler(["pack", "other-group-pack"], 1), "pack")
    assert not _others_wait(scheduler(["pack"], 1), "pack")
    assert not _others_wait(scheduler(["pack", "other"], 2), "pack")  # a second thread runs it
    assert not _others_wait(scheduler(["pack"], 1), "gone") and not _others_wait(scheduler([], 1), "unknown")


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (2, 2), ("3", 3), (0, None), (1.5, None), ("many", None),
                                             (True, None)])
def test_a_fixed_member_count_comes_from_dask_config_and_bad_values_are_refused(value, expected):
    import dask

    from graph import PipelineError
    from graph.compiling.packing import packed_members

    with dask.config.set({"quiver.packing.members": value}):
        if expected is None:
            with pytest.raises(PipelineError, match="quiver.packing.members"):
                packed_members()
        else:
            assert packed_members() == expected
