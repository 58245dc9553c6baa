"""The halving rule checked on a finished run's own rung record (docs/architecture.md §7):
shared by the pruning-run tests (generator steps) and the packing tests (packed gpu.train)."""

from __future__ import annotations


def check_rule(result, factor):
    """The run's rung decisions equal the rule written out on the run's own arrival order, no
    branch is counted twice at a rung, and every branch stopped exactly where it was told."""
    by_rung: dict = {}
    for e in result.rungs:
        by_rung.setdefault((e["group"], e["rung"]), []).append(e)
    stopped_at = {}
    for (group, rung), entries in by_rung.items():
        assert len({e["input"] for e in entries}) == len(entries), "a branch counted twice at a rung"
        there = []
        for n, e in enumerate(entries, 1):
            there.append((-e["metric"], e["input"]))
            assert e["n"] == n
            assert e["continued"] == (sorted(there).index((-e["metric"], e["input"])) < max(1, n // factor))
            if not e["continued"]:
                stopped_at[e["input"]] = e["iteration"]
    for i, row in result.table.iterrows():
        if i in stopped_at:
            assert row["status"] == "pruned" and row["iterations"] == stopped_at[i]
        else:
            assert row["status"] in ("ok", "failed", "cancelled"), row["status"]
    return stopped_at
