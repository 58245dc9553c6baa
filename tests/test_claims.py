"""Which packed task trains which member (graph/claims.py, docs/architecture.md §7.3): the pure
claim rule with literal inputs and hypothesis; a real cluster's packed runs are in test_packing.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graph.claims import claim

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
