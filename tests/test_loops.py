"""A user's own training loop, declared so a run can pack it (gpu/loops.py): the built-in step is
torch.optim.SGD, a packed member reports what its solo run reports (built-in and user-written
steps), members leave without disturbing the others, bad declarations are refused with the fix;
and on a real LocalCluster with worker processes, packed ``gpu.train_loop`` branches are pruned by
the halving rule with the curves they have alone, also when a worker is SIGKILLed mid-pack."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import gpu
from gpu import lr_schedules
import pipelines
from gpu.loops import PackedLoop, train_loop
from graph.compiling.packing import packable_groups
from pipelines import Pipeline, grid

pytestmark = pytest.mark.timeout(240)

MLP = functools.partial(gpu.MLP, 64, 10, hidden=(16,))
LOOP = gpu.Loop(model=MLP)
CURVE = ("epoch", "loss", "accuracy", "test_loss")


@pytest.fixture(scope="module")
def digits():
    return gpu.load_digits_tensors(seed=0)


def curve(reports):
    return [[r[k] for k in CURVE] for r in reports]


def assert_same_curves(packed, alone):
    assert len(packed) == len(alone)
    for p, s in zip(curve(packed), curve(alone)):
        assert p == pytest.approx(s, rel=1e-5, abs=1e-6)


def hand_epochs(net, opt, gen, data, batch, epochs, lr_at=None):
    """Epochs of the loop a user writes by hand (examples/tune_mnist.py's train_mlp, on the
    digits): a seeded shuffle per epoch, the last incomplete batch dropped, ``lr_at(step, total)``
    set before each step when given; the held-out accuracy after each epoch."""
    x, y = data.x_train, data.y_train
    steps, out = len(x) // batch, []
    for e in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(steps):
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(e * steps + i, epochs * steps)
            idx = order[i * batch:(i + 1) * batch]
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            out.append(float((net(data.x_test).argmax(1) == data.y_test).float().mean()))
    return out


def torch_sgd_accuracies(data, lr, momentum, weight_decay, batch, epochs, seed):
    torch.manual_seed(seed)
    net = MLP()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    return hand_epochs(net, opt, torch.Generator().manual_seed(seed * 1000), data, batch, epochs)


def plain_sgd_step(forward, state, batch, hp):
    """A user-written step: plain SGD, as a pure function of one member's state."""
    x, y = batch
    grads, loss = torch.func.grad_and_value(lambda p: F.cross_entropy(forward(p, x), y))(state["params"])
    return {"params": {k: v - hp["lr"] * grads[k] for k, v in state["params"].items()}}, loss


def run_pack(pack, remove=None):
    """Train ``pack`` to its end; ``{name: reports}``; ``remove``: ``{name: after epoch n}``."""
    seen: dict = {}
    while pack.active:
        for name, report in pack.epoch().items():
            seen.setdefault(name, []).append(report)
            if remove and remove.get(name) == report["epoch"]:
                pack.remove(name)
    return seen


# ---- in this process ---------------------------------------------------------------------------


def test_the_built_in_step_is_torch_sgd_with_the_users_seeded_order(digits):
    reports = list(train_loop(digits, loop=LOOP, lr=0.05, momentum=0.5, weight_decay=1e-3, batch_size=16,
                              epochs=3, seed=2))
    expected = torch_sgd_accuracies(digits, 0.05, 0.5, 1e-3, 16, 3, 2)
    assert [r["accuracy"] for r in reports] == pytest.approx(expected, abs=1e-6)
    assert [r["epoch"] for r in reports] == [1, 2, 3]


@pytest.mark.parametrize("loop", [LOOP, gpu.Loop(model=MLP, step=plain_sgd_step)], ids=["built-in", "own-step"])
def test_packed_members_report_what_their_solo_runs_report(digits, loop):
    members = {"a": dict(lr=0.1, seed=0, epochs=3), "b": dict(lr=0.02, seed=1, epochs=2),
               "c": dict(lr=0.5, seed=2, epochs=3)}
    pack = PackedLoop(digits, loop, members, batch_size=16)
    seen = run_pack(pack)
    for name, own in members.items():
        gen = train_loop(digits, loop=loop, batch_size=16, **own)
        alone = list(gen)
        assert_same_curves(seen[name], alone)
        assert max(r["members"] for r in seen[name]) == 3
        result = pack.result(name)
        with torch.no_grad():
            accuracy = float((result["model"](digits.x_test).argmax(1) == digits.y_test).float().mean())
        assert accuracy == pytest.approx(alone[-1]["accuracy"], abs=1e-6)  # the trained model, not a copy


def test_a_removed_member_leaves_the_others_unchanged_and_a_waiting_one_joins(digits):
    members = {"a": dict(lr=0.1, seed=0, epochs=3), "b": dict(lr=0.3, seed=1, epochs=3),
               "c": dict(lr=0.05, seed=2, epochs=2)}
    pack = PackedLoop(digits, LOOP, members, active=2, batch_size=16)
    assert pack.active == ["a", "b"] and pack.pending == ["a", "b", "c"]
    seen = run_pack(pack, remove={"b": 1})
    assert [r["epoch"] for r in seen["b"]] == [1]
    assert seen["c"][0]["members"] == 2  # it took b's place after epoch 1
    for name in ("a", "c"):
        assert_same_curves(seen[name], list(train_loop(digits, loop=LOOP, batch_size=16, **members[name])))
    with pytest.raises(ValueError, match="has not finished .*removed"):
        pack.result("b")


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
@pytest.mark.parametrize("loop", [LOOP, gpu.Loop(model=MLP, step=plain_sgd_step)], ids=["built-in", "own-step"])
def test_a_member_moved_to_another_pack_goes_on_as_if_it_had_stayed(digits, loop):
    """snapshot() in one PackedLoop, add(resume=...) in another (a take-over's move): the moved
    member's later epochs, momentum and batch order included, are those of its solo run, with a
    cosine schedule whose clock moves along; the pack it left goes on unchanged."""
    members = {"a": dict(lr=0.1, momentum=0.9, seed=0, epochs=5, schedule="cosine"), "b": dict(lr=0.05, seed=1, epochs=5)}
    if loop.step is not None:
        members = {k: {p: v for p, v in m.items() if p not in ("momentum", "schedule")} for k, m in members.items()}
    old = PackedLoop(digits, loop, members, batch_size=16)
    seen = run_pack(old, remove={"a": 2})  # a leaves after epoch 2 ...
    assert [r["epoch"] for r in seen["a"]] == [1, 2]
    old2 = PackedLoop(digits, loop, members, batch_size=16)
    for _ in range(2):
        old2.epoch()
    state = old2.snapshot("a")
    assert PackedLoop(digits, loop, members, batch_size=16, active=1).snapshot("b") is None  # b waits: nothing to move
    new = PackedLoop(digits, loop, {"c": dict(lr=0.3, seed=5, epochs=5)}, batch_size=16)
    new.add("a", members["a"], resume=state)  # ... and goes on in another pack, beside a member of its own
    after = run_pack(new)
    alone = list(train_loop(digits, loop=loop, batch_size=16, **members["a"]))
    assert [r["epoch"] for r in after["a"]] == [3, 4, 5]
    assert_same_curves(state["history"] + after["a"], alone)
    assert [r["epoch"] for r in new.result("a")["history"]] == [1, 2, 3, 4, 5]
    assert_same_curves(seen["b"], list(train_loop(digits, loop=loop, batch_size=16, **members["b"])))
    with pytest.raises(ValueError, match="not members"):
        PackedLoop(digits, loop, {"c": dict(lr=0.3)}, batch_size=16, resume={"zz": state})


def fixed_lr_step(forward, state, batch, hp):
    """A user-written step with no hyper-parameters of its own (its rate is fixed inside)."""
    x, y = batch
    grads, loss = torch.func.grad_and_value(lambda p: F.cross_entropy(forward(p, x), y))(state["params"])
    return {"params": {k: v - 0.1 * grads[k] for k, v in state["params"].items()}}, loss


def test_a_step_without_hyper_parameters_packs_and_drops_members(digits):
    loop = gpu.Loop(model=MLP, step=fixed_lr_step)
    members = {"a": dict(seed=0, epochs=2), "b": dict(seed=1, epochs=2), "c": dict(seed=2, epochs=2)}
    seen = run_pack(PackedLoop(digits, loop, members, batch_size=16), remove={"b": 1})
    assert [r["epoch"] for r in seen["b"]] == [1]
    for name in ("a", "c"):  # the rows of a and c stay theirs when b's leave
        assert_same_curves(seen[name], list(train_loop(digits, loop=loop, batch_size=16, **members[name])))


def test_auto_members_are_tuned_without_changing_training(digits):
    members = {"a": dict(lr=0.1, seed=0, epochs=1), "b": dict(lr=0.3, seed=1, epochs=1)}
    pack = PackedLoop(digits, LOOP, members, active="auto", batch_size=16)
    assert 1 <= pack.active_limit <= 2 and pack.tuning[0][0] == 1
    seen = run_pack(pack)
    for name in members:
        assert_same_curves(seen[name], list(train_loop(digits, loop=LOOP, batch_size=16, **members[name])))


def test_bad_loops_are_refused_with_the_fix(digits):
    with pytest.raises(ValueError, match="zero-argument callable .* not a module"):
        gpu.Loop(model=MLP())
    with pytest.raises(ValueError, match="init= makes the state of your own step="):
        gpu.Loop(model=MLP, init=lambda p, hp: {"params": p})
    with pytest.raises(ValueError, match=r"\['beta'\] are not parameters of the built-in SGD step"):
        next(train_loop(digits, loop=LOOP, lr=0.1, beta=0.9))
    with pytest.raises(ValueError, match="lr= is required"):
        next(train_loop(digits, loop=LOOP))
    with pytest.raises(ValueError, match="must be numbers"):
        next(train_loop(digits, loop=LOOP, lr="0.1"))

    def ragged(data, batch_size, generator):
        yield data.x_train[:batch_size], data.y_train[:batch_size]
        if generator.initial_seed() == 0:
            yield data.x_train[:batch_size], data.y_train[:batch_size]

    pack = PackedLoop(digits, gpu.Loop(model=MLP, batches=ragged), {"a": dict(lr=0.1, seed=0), "b": dict(lr=0.1, seed=1)},
                      batch_size=16)
    with pytest.raises(ValueError, match="same number of batches of the same shapes"):
        pack.epoch()


def hand_two_stages(data, lr, momentum, warm_epochs, schedule, batch, epochs, lr2=None):
    """A warm-up with a ramped rate, then a fine-tuning continuing the same optimizer (its
    momentum buffers) and batch-order generator with a decay ``schedule``: the loop by hand."""
    torch.manual_seed(0)
    net = MLP()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(0)
    hand_epochs(net, opt, gen, data, 16, warm_epochs, lambda i, n: lr * lr_schedules.factor("ramp", i, n))
    base = lr if lr2 is None else lr2
    return hand_epochs(net, opt, gen, data, batch, epochs, lambda i, n: base * lr_schedules.factor(schedule, i, n))


def drain(gen):
    reports = []
    while True:
        try:
            reports.append(next(gen))
        except StopIteration as stop:
            return reports, stop.value


def test_a_second_stage_continues_the_checkpoint_with_each_members_schedule(digits):
    """Stage 2 continues stage 1's weights, momentum buffers and batch order, each member with its
    own decay schedule (and the warm-up's lr and momentum unless it sets its own): packed, it
    reports what the loop written by hand reports."""
    _, warm = drain(train_loop(digits, loop=LOOP, lr=0.1, momentum=0.9, batch_size=16, epochs=2, schedule="ramp"))
    assert isinstance(warm["checkpoint"], gpu.Checkpoint) and warm["checkpoint"].epochs == 2
    members = {"cos": dict(schedule="cosine", epochs=3), "exp": dict(schedule="exponential", epochs=2),
               "flat": dict(epochs=3), "slow": dict(schedule="linear", lr=0.02, epochs=3)}
    seen = run_pack(PackedLoop(warm, LOOP, members, batch_size=32))
    for name, own in members.items():
        want = hand_two_stages(digits, 0.1, 0.9, 2, own.get("schedule", "constant"), 32, own["epochs"],
                               lr2=own.get("lr"))
        assert [r["accuracy"] for r in seen[name]] == pytest.approx(want, abs=1e-6), name
        assert seen[name][0]["members"] == 4
    # the same member alone continues identically, and its own result continues again (a third stage)
    alone, second = drain(train_loop(warm, loop=LOOP, batch_size=32, epochs=3, schedule="cosine"))
    assert_same_curves(seen["cos"], alone)
    assert second["checkpoint"].epochs == 5 and second["checkpoint"].data is warm["checkpoint"].data
    third, _ = drain(train_loop(second, loop=LOOP, batch_size=32, epochs=1))
    assert third[0]["accuracy"] > 0.5


def test_schedules_and_checkpoints_refuse_bad_input_with_the_fix(digits):
    with pytest.raises(ValueError, match=r"schedule='step' is not one of \['constant', 'linear'"):
        next(train_loop(digits, loop=LOOP, lr=0.1, schedule="step"))
    with pytest.raises(ValueError, match="schedule='cosine' but its step takes no lr="):
        next(train_loop(digits, loop=gpu.Loop(model=MLP, step=fixed_lr_step), schedule="cosine"))
    _, warm = drain(train_loop(digits, loop=LOOP, lr=0.1, batch_size=16, epochs=1))
    wider = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10, hidden=(32,)))
    with pytest.raises(ValueError, match="checkpoint's weights do not fit this loop's model"):
        next(train_loop(warm, loop=wider, batch_size=16, epochs=1))


@given(schedule=st.sampled_from(lr_schedules.SCHEDULES), total=st.integers(1, 10_000), data=st.data())
def test_built_in_schedules_stay_between_a_tenth_or_zero_and_one(schedule, total, data):
    step = data.draw(st.integers(0, total - 1))
    f = lr_schedules.factor(schedule, step, total)
    assert 0.0 <= f <= 1.0
    if step == 0 and schedule != "ramp":
        assert f == 1.0  # a decay starts at the base rate
    if schedule == "ramp" and step == total - 1:
        assert f == pytest.approx(1.0)  # a warm-up ends at it


def explore(**overrides):
    params = dict(loop=[LOOP], lr=[0.01, 0.1], momentum=[0.9], epochs=[2], batch_size=[32])
    params.update(overrides)
    return Pipeline("digits").source(gpu.load_digits_tensors, seed=0).explore("t", grid(gpu.train_loop, **params))


def test_packable_loop_groups_follow_the_rule():
    assert [len(g) for g in packable_groups(explore().compile().graph)] == [2]
    assert [len(g) for g in packable_groups(explore(seed=[0, 1], epochs=[2, 3]).compile().graph)] == [8]
    assert [len(g) for g in packable_groups(explore(batch_size=[16, 32]).compile().graph)] == [2, 2]
    other = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10, hidden=(8,)))
    assert [len(g) for g in packable_groups(explore(loop=[LOOP, other]).compile().graph)] == [2, 2]


# ---- on a real cluster ---------------------------------------------------------------------------


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_packed_pruning_run_of_a_users_loop_prunes_by_the_rule_with_solo_curves(client):
    from tests.rule_check import check_rule

    node = explore(lr=[0.003, 0.01, 0.05, 0.2, 1.0], epochs=[3])
    seen_before = len(client.get_events("quiver-training"))
    packed = node.choose("accuracy", prune=pipelines.halving(factor=3)).run(client, pack=True, progress=False,
                                                                           quiet=True)
    published = [m for _, m in client.get_events("quiver-training")[seen_before:]]
    full = node.choose("accuracy").run(client, pack=False, progress=False, quiet=True)
    assert packed.stats["packed_branches"] == 5 and "packed_groups" not in full.stats
    check_rule(packed, factor=3)
    table = packed.table
    assert (table["status"] == "pruned").any() and set(table["status"]) <= {"ok", "pruned"}
    for row in range(len(table)):
        mine, alone = packed.history[row], full.history[row]
        assert [r["accuracy"] for r in mine] == pytest.approx([r["accuracy"] for r in alone[:len(mine)]], abs=1e-6)
    # the dashboard's training page: each member's start, its epochs (as many as its reports) and its end
    by_task: dict = {}
    for m in published:
        by_task.setdefault(m["task"], []).append(m)
    assert len(by_task) == len(table)
    # (distinct epochs: a member an idle pack takes over replays its first epochs there)
    assert sorted(len({m["epoch"] for m in ms if m["kind"] == "epoch"}) for ms in by_task.values()) == \
        sorted(table["iterations"])
    assert all(ms[0]["kind"] == "start" and ms[0]["algorithm"] == "loop" and ms[-1]["kind"] == "end"
               for ms in by_task.values())
    finished = table[table["status"] == "ok"]
    assert packed.value["accuracy"] == pytest.approx(finished["accuracy"].max())
    assert isinstance(packed.value["model"], torch.nn.Module)


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_worker_killed_mid_pack_gives_the_same_decisions():
    """SIGKILL the worker whose packed loop task has just reported: Dask reruns it, the members
    are retrained from their seeds, replayed reports are not counted again, the rule holds on the
    run's arrivals and every curve is a prefix of its solo run's."""
    from tests.rule_check import check_rule, run_killing_a_reporting_pack

    grid_ = explore(lr=[0.01, 0.03, 0.05, 0.1, 0.0003, 0.0001], epochs=[9])
    result, alone, killed = run_killing_a_reporting_pack(grid_.choose("accuracy", prune=pipelines.halving(factor=3)),
                                                         grid_.choose("accuracy"))
    assert killed, "every packed task ended before a worker could be killed"
    check_rule(result, factor=3)
    assert result.stats["packed_branches"] == 6 and result.stats["reports_replayed"] > 0
    assert result.stats["reports"] == result.table["iterations"].sum()
    for h, full in zip(result.history, alone.history):
        assert [r["epoch"] for r in h] == list(range(1, len(h) + 1))
        assert [r["accuracy"] for r in h] == pytest.approx([r["accuracy"] for r in full[:len(h)]], abs=1e-6)
    finished = result.table[result.table["status"] == "ok"]
    assert result.value["accuracy"] == pytest.approx(finished["accuracy"].max())


def _import_loops():
    import gpu.loops  # noqa: F401


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_an_idle_packed_loop_task_takes_a_member_over_and_goes_on_from_its_state(client, digits):
    """A packed loop task that starts when its group's other one holds every member takes one over
    and *moves* it (graph/state/claims.py: moves): the old owner hands the member's state over at
    its next epoch and the taker goes on from there. No epoch is trained twice (no report is
    replayed), every iteration reaches the run once and in order, each member ends in one result
    with its whole history, and every curve is its solo run's."""
    from graph.compiling.packing import packed_train
    from tests.rule_check import run_a_late_second_pack

    members = {"t-a": dict(lr=0.05, seed=0, epochs=40), "t-b": dict(lr=0.2, seed=1, momentum=0.5, epochs=40)}
    client.run(_import_loops)  # the second task's worker must not spend its first seconds importing torch

    def submit(key):
        return client.submit(packed_train, digits, model=LOOP, members=members, shared={"batch_size": 16},
                             prunes=dict.fromkeys(members), active=2, claims="mv", packs=("mv-0", "mv-1"),
                             kind="loop", key=key, pure=False)

    values, delivered, table, replayed = run_a_late_second_pack(client, submit, "mv", members, 40)
    assert len(table["takeovers"]) == 1
    taken, old, new, made = table["takeovers"][0]
    assert (taken, old, new) == ("t-b", "mv-0", "mv-1") and made >= 1
    assert sorted(values[0]) == ["t-a"] and sorted(values[1]) == ["t-b"]
    assert replayed == 0  # moved, not retrained: nothing was sent twice
    for k in members:
        assert [i for key, i in delivered if key == k] == list(range(1, 41))
    result = {**values[0], **values[1]}
    for k, own in members.items():
        assert [r["epoch"] for r in result[k]["history"]] == list(range(1, 41))
        assert_same_curves(result[k]["history"], list(train_loop(digits, loop=LOOP, batch_size=16, **own)))

