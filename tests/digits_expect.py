"""What a first run of ``examples/digits_explore.py --store DIR --json FILE`` must show, wherever it
runs (a CLI cluster on loopback, several hosts in network namespaces): one place for the numbers.

3 scalers x 3 PCA sizes x 7 models = 63 branches over 1 load + 3 scale + 9 pca + 63 fit + 1 test
tasks; one branch chosen, the most accurate; every step and every metric saved to the store.
"""

from __future__ import annotations

BRANCHES = 63
TASKS = 1 + 3 + 9 + 63 + 1


def assert_first_digits_run(data: dict) -> list[dict]:
    """Check a first (empty-store) run's JSON export; return its table rows."""
    rows, stats = data["table"], data["stats"]
    assert len(rows) == BRANCHES and stats["executed_tasks"] == TASKS
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["accuracy"] == max(r["accuracy"] for r in rows)
    assert stats["saved_to_store"] == stats["executed_tasks"] + BRANCHES  # every step and every metric
    return rows


def assert_rerun_loads_everything(stats: dict) -> None:
    """A second run over the same store recomputes nothing (every branch's metric + the test score)."""
    assert stats["executed_tasks"] == 0 and stats["loaded_from_store"] == BRANCHES + 1
