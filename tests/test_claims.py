"""Which packed task trains which member (graph/state/claims.py, docs/architecture.md §7.3): the pure
claim rule with literal inputs and hypothesis; a real cluster's packed runs are in test_packing.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.state.claims import arriving, claim, collect, give, progress

ORDER = ["a", "b", "c", "d", "e"]
PACKS = ["p0", "p1"]


def test_members_go_in_declaration_order_and_once():
    t: dict = {}
    assert claim(t, "p0", "x", ORDER, PACKS, want=2) == ["a", "b"]
    assert claim(t, "p1", "y", ORDER, PACKS, want=2) == ["c", "d"]
    assert claim(t, "p0", "x", ORDER, PACKS, want=2) == ["e"]  # only one left
    assert claim(t, "p1", "y", ORDER, PACKS, want=3) == []  # nothing left: the pack ends
    assert t["owner"] == {"a": "p0", "b": "p0", "c": "p1", "d": "p1", "e": "p0"}


def test_a_fair_first_fill_leaves_a_share_for_the_packs_not_started():
    t: dict = {}
    assert claim(t, "p0", "x", ORDER, ["p0", "p1", "p2"], want=1) == ["a"]
    # 4 unclaimed, two packs not started and this one: ceil(4 / 3) = 2
    assert claim(t, "p0", "x", ORDER, ["p0", "p1", "p2"], want=4, fair=True) == ["b", "c"]
    assert claim(t, "p1", "y", ORDER, ["p0", "p1", "p2"], want=4, fair=True) == ["d"]  # ceil(2 / 2)
    assert claim(t, "p2", "z", ORDER, ["p0", "p1", "p2"], want=4, fair=True) == ["e"]
    # not fair: a pack whose members left takes all it has room for
    t2: dict = {}
    assert claim(t2, "p0", "x", ORDER, PACKS, want=4) == ORDER[:4]


def test_a_restarted_pack_takes_back_its_members_first():
    t: dict = {}
    claim(t, "p0", "x", ORDER, PACKS, want=2)
    claim(t, "p1", "y", ORDER, PACKS, want=2)
    # p0's worker died: Dask runs p0 again (a new attempt), which retrains a and b (and may take more)
    assert claim(t, "p0", "x2", ORDER, PACKS, want=3) == ["a", "b", "e"]
    assert claim(t, "p0", "x2", ORDER, PACKS, want=3) == []  # the same attempt again: nothing twice


@st.composite
def schedules(draw):
    """A random interleaving of claims by a few packs, each with random restarts."""
    order = [f"m{i}" for i in range(draw(st.integers(0, 12)))]
    packs = [f"p{i}" for i in range(draw(st.integers(1, 4)))]
    calls = draw(st.lists(st.tuples(st.sampled_from(packs), st.integers(0, 5), st.booleans(), st.booleans()),
                          max_size=40))
    return order, packs, calls


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_no_member_is_trained_by_two_live_packs_and_none_is_lost(schedule):
    order, packs, calls = schedule
    t: dict = {}
    attempt = {p: 0 for p in packs}
    holds: dict = {p: [] for p in packs}  # what each pack's current attempt trains
    for pack, want, fair, restart in calls:
        if restart:
            attempt[pack] += 1
            holds[pack] = []
        had = [k for k in order if t.get("owner", {}).get(k) == pack]
        got = claim(t, pack, attempt[pack], order, packs, want, fair)
        assert not set(got) & set(holds[pack])  # never the same member twice to one attempt
        new = [k for k in got if k not in had]
        assert len(new) <= want  # new claims: at most what was asked for
        assert got[:len(got) - len(new)] == ([k for k in had if k not in holds[pack]] if not holds[pack] else [])
        holds[pack] += got
        owners = {k: p for p, ks in holds.items() for k in ks}
        assert sum(map(len, holds.values())) == len(owners)  # no member in two packs at once
        assert all(t["owner"][k] == p for k, p in owners.items())
    # packs that keep claiming until nothing comes take every member, each by exactly one pack
    for pack in packs:
        while claim(t, pack, attempt[pack], order, packs, want=3):
            pass
    assert sorted(t.get("owner", {})) == sorted(order)


# ---- take-over: an idle pack takes a member from a busier one (replayed from its seed) -----------
H = dict.fromkeys(ORDER, 12)  # every member's most epochs


def test_an_idle_pack_takes_over_the_least_trained_member_of_a_busier_pack():
    t: dict = {}
    assert claim(t, "p0", "x", ORDER[:3], PACKS, want=3) == ["a", "b", "c"]
    assert progress(t, "p0", made={"a": 3, "b": 1, "c": 2}) == []
    # p1 starts with nothing unclaimed: it takes b (fewest epochs made, so the least to replay)
    assert claim(t, "p1", "y", ORDER[:3], PACKS, want=1, horizon=H) == ["b"]
    assert t["owner"]["b"] == "p1" and t["takeovers"] == [("b", "p0", "p1", 1)]
    # p0 learns it at its next epoch, and drops b; p1 trains b from epoch 0
    assert progress(t, "p0", made={"a": 4, "b": 2, "c": 3}) == ["b"]
    assert progress(t, "p1", made={"b": 1}) == []
    assert t["made"] == {"a": 4, "b": 1, "c": 3}


def test_ties_go_to_the_later_declared_and_finished_members_stay():
    t: dict = {}
    claim(t, "p0", "x", ORDER[:3], PACKS, want=3)
    progress(t, "p0", made={"a": 2, "b": 2, "c": 2}, done=["c"])  # c trained out (or was pruned)
    assert claim(t, "p1", "y", ORDER[:3], PACKS, want=1, horizon=H) == ["b"]  # a and b tie: the later one


def test_no_take_over_when_it_would_not_pay_or_would_leave_a_pack_idle():
    t: dict = {}
    claim(t, "p0", "x", ORDER[:2], PACKS, want=2)
    progress(t, "p0", made={"a": 6, "b": 7})
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H) == []  # 2 * made >= 12: replaying costs more
    progress(t, "p0", made={"a": 6, "b": 5})
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1) == []  # no horizon: no take-over
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=0, horizon=H) == []  # no room
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H) == ["b"]
    # p0 is left with a alone: nobody takes a pack's last unfinished member
    assert claim(t, "p2", "z", ORDER[:2], ["p0", "p1", "p2"], want=1, horizon=H) == []


def test_a_pack_with_a_member_of_its_own_takes_nothing_over_and_nothing_moves_back():
    t: dict = {}
    claim(t, "p0", "x", ORDER[:3], PACKS, want=2)  # a, b
    claim(t, "p1", "y", ORDER[:3], PACKS, want=1)  # c
    assert claim(t, "p1", "y", ORDER[:3], PACKS, want=1, horizon=H) == []  # p1 still trains c
    progress(t, "p1", made={"c": 1}, done=["c"])
    assert claim(t, "p1", "y", ORDER[:3], PACKS, want=1, horizon=H) == ["b"]
    progress(t, "p0", made={"a": 1}, done=["a"])
    claim(t, "p1", "y", ORDER[:3], PACKS, want=1)  # nothing
    # p0 is idle now and p1 holds b alone: b does not move back (nor would it, from a pack holding one)
    assert claim(t, "p0", "x", ORDER[:3], PACKS, want=1, horizon=H) == []


@st.composite
def busy_schedules(draw):
    """Claims with take-overs, progress reports (epochs made, members ending) and restarts."""
    order = [f"m{i}" for i in range(draw(st.integers(1, 8)))]
    packs = [f"p{i}" for i in range(draw(st.integers(1, 4)))]
    calls = draw(st.lists(st.tuples(st.sampled_from(packs), st.sampled_from(["claim", "epoch", "end", "restart"]),
                                    st.integers(0, 3)), max_size=60))
    return order, packs, calls


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(busy_schedules())
def test_take_overs_keep_one_trainer_per_member_and_only_empty_busier_packs(schedule):
    order, packs, calls = schedule
    horizon = dict.fromkeys(order, 6)
    t: dict = {}
    attempt = {p: 0 for p in packs}
    holds: dict = {p: {} for p in packs}  # pack -> {member: epochs made} that its attempt trains
    ended: set = set()
    for pack, op, n in calls:
        if op == "restart":
            attempt[pack] += 1
            holds[pack] = {}
        elif op == "epoch":
            for k in holds[pack]:
                if k not in ended:
                    holds[pack][k] += 1
            lost = progress(t, pack, made=dict(holds[pack]))
            for k in lost:
                assert t["owner"][k] != pack
                del holds[pack][k]
        elif op == "end" and holds[pack]:
            k = sorted(holds[pack])[n % len(holds[pack])]
            ended.add(k)
            progress(t, pack, made=dict(holds[pack]), done=[k])
        else:
            before = dict(t.get("owner", {}))
            busy = {p: sum(1 for k, q in before.items() if q == p and k not in t.get("done", {})) for p in packs}
            made = dict(t.get("made", {}))
            got = claim(t, pack, attempt[pack], order, packs, want=n, horizon=horizon)
            for k in got:
                if before.get(k) not in (None, pack):  # taken over
                    assert busy[pack] == 0 and busy[before[k]] >= 2 and 2 * made.get(k, 0) < 6
                    assert len(got) == 1 and k not in ended
                holds[pack][k] = 0
        # the table names one owner per member; a pack holding a member it does not own lost it to a
        # take-over, and drops it at its next epoch (progress says so, checked above)
        taken = {(k, old) for k, old, _, _ in t.get("takeovers", ())}
        for p, ks in holds.items():
            assert all(t["owner"][k] == p or (k, p) in taken for k in ks)
    for pack in packs:  # packs that keep claiming take every member, each owned by exactly one pack
        while claim(t, pack, attempt[pack], order, packs, want=3):
            pass
    assert sorted(t.get("owner", {})) == sorted(order)


# --- moves: the taker goes on from the member's state (a trainer that can hand it over) --------


def test_a_move_hands_the_state_over_instead_of_replaying():
    t: dict = {}
    assert claim(t, "p0", "x", ORDER[:2], PACKS, want=2) == ["a", "b"]
    progress(t, "p0", made={"a": 7, "b": 8})
    # 2 * 7 >= 12: a replay would not pay, a move does (4 epochs left, one waited)
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H) == []
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == ["a"]
    assert arriving(t, "p1", ["a"]) == ["a"] and t["made"]["a"] == 7  # not retrained: its epochs count
    assert collect(t, "p1", "a") == ("wait", None)  # p0 has not reached its next epoch yet
    assert give(t, "p1", "a", "s") is False  # only the old owner gives
    assert progress(t, "p0", made={"a": 8, "b": 9}) == ["a"]
    assert give(t, "p0", "a", "state at 8") is True
    assert collect(t, "p1", "a") == ("resume", "state at 8")
    assert arriving(t, "p1", ["a"]) == [] and give(t, "p0", "a", "late") is False  # collected once
    assert progress(t, "p1", made={"a": 9}) == [] and t["made"]["a"] == 9


def test_a_move_pays_only_while_two_epochs_are_left():
    t: dict = {}
    claim(t, "p0", "x", ORDER[:2], PACKS, want=2)
    progress(t, "p0", made={"a": 11, "b": 10})
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == ["b"]  # 12 - 10 = 2 left
    t2: dict = {}
    claim(t2, "p0", "x", ORDER[:2], PACKS, want=2)
    progress(t2, "p0", made={"a": 11, "b": 11})
    assert claim(t2, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == []


def test_a_member_that_ends_on_its_old_owner_before_the_hand_over_stays_there():
    t: dict = {}
    claim(t, "p0", "x", ORDER[:2], PACKS, want=2)
    progress(t, "p0", made={"a": 3, "b": 3})
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == ["b"]
    # p0's next epoch pruned b (a rung) before it heard of the move: b stays with p0, done
    assert progress(t, "p0", made={"a": 4}, done=["b"]) == []
    assert t["owner"]["b"] == "p0" and t["done"]["b"]
    assert collect(t, "p1", "b") == ("drop", None) and give(t, "p0", "b", "s") is False
    assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == []  # a: p0 holds only one


def test_the_taker_replays_when_the_old_owner_restarted_or_stopped():
    for restart in (True, False):
        t: dict = {}
        claim(t, "p0", "x", ORDER[:2], PACKS, want=2)
        progress(t, "p0", made={"a": 3, "b": 2})
        assert claim(t, "p1", "y", ORDER[:2], PACKS, want=1, horizon=H, moves=True) == ["b"]
        if restart:  # p0's worker died: Dask reruns it, and it takes back what it still owns
            assert claim(t, "p0", "x2", ORDER[:2], PACKS, want=2) == ["a"]
            assert collect(t, "p1", "b") == ("replay", None)
        else:  # its task is no longer running (cancelled): it will never hand b over
            assert collect(t, "p1", "b", alive=False) == ("replay", None)
        assert t["made"]["b"] == 0 and give(t, "p0", "b", "s") is False


@st.composite
def moving_schedules(draw):
    """Claims (with moves), epochs, endings, hand-overs, collections and restarts, any order."""
    order = [f"m{i}" for i in range(draw(st.integers(1, 6)))]
    packs = [f"p{i}" for i in range(draw(st.integers(1, 3)))]
    ops = ["claim", "epoch", "end", "restart", "give", "collect", "collect_dead"]
    calls = draw(st.lists(st.tuples(st.sampled_from(packs), st.sampled_from(ops), st.integers(0, 3)), max_size=80))
    return order, packs, calls


@settings(max_examples=300, deadline=None)
@given(moving_schedules())
def test_moves_never_let_two_packs_train_one_member_nor_lose_one(schedule):
    """Packs that follow the protocol (a taker trains a moving member only once ``collect`` says so;
    an old owner gives what it lost at its next epoch) never train one member in two packs at once,
    a member's epochs go on from the state handed over, and every member ends up owned."""
    order, packs, calls = schedule
    horizon = dict.fromkeys(order, 6)
    t: dict = {}
    attempt = {p: 0 for p in packs}
    trains: dict = {p: {} for p in packs}  # pack -> {member: epochs} it trains now
    awaiting: dict = {p: set() for p in packs}  # members moving to the pack, not collected yet
    owed: dict = {p: {} for p in packs}  # pack -> {member: epochs} it lost and must hand over
    ended: set = set()
    stopped: set = set()  # packs whose task ended (cancelled): they train nothing more
    for pack, op, n in calls:
        if pack in stopped and op != "restart":
            continue
        if op == "restart":
            attempt[pack] += 1
            stopped.discard(pack)
            trains[pack], awaiting[pack], owed[pack] = {}, set(), {}
            got = claim(t, pack, attempt[pack], order, packs, want=0)
            moving = arriving(t, pack, got)
            for k in got:  # its own members again: retrained from their seeds, or still to collect
                if k in moving:
                    awaiting[pack].add(k)
                else:
                    trains[pack][k] = 0
        elif op == "epoch":
            for k in trains[pack]:
                if k not in ended:
                    trains[pack][k] += 1
            for k in progress(t, pack, made=dict(trains[pack])):
                owed[pack][k] = trains[pack].pop(k)
        elif op == "end" and trains[pack]:
            k = sorted(trains[pack])[n % len(trains[pack])]
            ended.add(k)
            for lost in progress(t, pack, made=dict(trains[pack]), done=[k]):
                owed[pack][lost] = trains[pack].pop(lost)
        elif op == "give" and owed[pack]:
            k = sorted(owed[pack])[0]
            give(t, pack, k, owed[pack].pop(k))
        elif op in ("collect", "collect_dead") and awaiting[pack]:
            k = sorted(awaiting[pack])[0]
            if op == "collect_dead":  # the old owner's task ends before it hands k over
                old = t["moving"][k]["from"]
                stopped.add(old)
                trains[old], awaiting[old], owed[old] = {}, set(), {}
            what, state = collect(t, pack, k, alive=op == "collect")
            if what != "wait":
                awaiting[pack].discard(k)
            if what == "resume":
                trains[pack][k] = state
            elif what in ("replay", "start"):
                trains[pack][k] = 0
        elif op == "claim":
            got = claim(t, pack, attempt[pack], order, packs, want=n, horizon=horizon, moves=True)
            moving = arriving(t, pack, got)
            for k in got:
                if k in moving:
                    awaiting[pack].add(k)
                elif k not in trains[pack]:
                    trains[pack][k] = 0
        for k in order:  # one trainer per member at any time
            assert sum(k in trains[p] for p in packs) <= 1, (k, trains)
        for p in packs:
            for k in trains[p]:
                assert t["owner"][k] == p or k in ended or any(k == m and p == old for m, old, _, _ in t["takeovers"])
    for pack in packs:
        while claim(t, pack, attempt[pack], order, packs, want=3):
            pass
    assert sorted(t.get("owner", {})) == sorted(order)
