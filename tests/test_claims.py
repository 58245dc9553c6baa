"""Which packed task trains which member (graph/state/claims.py, docs/architecture.md §7.3): the pure
claim rule with literal inputs and hypothesis; a real cluster's packed runs are in test_packing.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graph.state.claims import claim, progress

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
