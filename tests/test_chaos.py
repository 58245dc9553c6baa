"""Random faults, many runs (issue 28 point 6): the short version of ``benchmarks/chaos.py``.

The outcome rules are pure (``chaos.judge``, ``chaos.same_result``, ``chaos.draw_fault``) and
tested here with literal inputs; the real part (``--quick``: one run per fault kind, each on a
fresh cluster of ``dask scheduler`` / ``dask worker`` processes, the link fault on network
namespaces) is ``slow``: about half a minute per run on 2 shared cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402  (benchmarks/ is not a package)

STALL = 5.0
REF = {"rows": [{"scale.how": "none", "fit.lr": 1.0, "status": "ok", "accuracy": 0.86, "iterations": 9, "chosen": True},
                {"scale.how": "none", "fit.lr": 0.1, "status": "pruned", "accuracy": float("nan"), "iterations": 1, "chosen": False},
                {"scale.how": "standard", "fit.lr": 1.0, "status": "pruned", "accuracy": float("nan"), "iterations": 0, "chosen": False}],
       "value": {"accuracy": 0.86, "lr": 1.0, "epochs": 9}}
FINALS = {1.0: 0.86, 0.1: 0.58}


def result(**changes) -> dict:
    rows = [dict(r) for r in REF["rows"]]
    for i, row in changes.get("rows", {}).items():
        rows[i].update(row)
    return {"kind": "result", "result": {"rows": rows, "value": changes.get("value", REF["value"])}}


def verdict(outcome: dict, fault_at: float = 2.0) -> str:
    return chaos.judge(outcome, REF, FINALS, stall=STALL, fault_at=fault_at)[0]


def test_the_same_table_and_value_is_same():
    assert verdict(result()) == "same"


def test_a_losing_branch_may_end_pruned_or_ok_with_its_own_final_figure():
    # halving's verdicts depend on the order branches reach a rung: either end is the same result
    assert verdict(result(rows={1: {"status": "ok", "accuracy": 0.58, "iterations": 9}})) == "same"
    assert verdict(result(rows={1: {"status": "ok", "accuracy": 0.57, "iterations": 9}})) == "wrong"
    assert verdict(result(rows={1: {"status": "failed"}})) == "wrong"
    assert verdict(result(rows={1: {"status": "cancelled"}})) == "wrong"


def test_a_different_choice_value_or_dropped_branch_is_wrong():
    assert verdict(result(value={"accuracy": 0.58, "lr": 0.1, "epochs": 9})) == "wrong"
    assert verdict(result(rows={0: {"chosen": False}, 1: {"chosen": True}})) == "wrong"
    # a branch the plain choose dropped never trains, whatever the faults
    assert verdict(result(rows={2: {"status": "ok", "accuracy": 0.86}})) == "wrong"
    assert verdict({"kind": "result", "result": {"rows": REF["rows"][:2], "value": REF["value"]}}) == "wrong"


def test_a_run_error_is_clean_only_on_one_line_within_stall_timeout_plus_30_s():
    line = "the scheduler at tcp://10.0.0.1:8786 has not answered for 5 s: ... (stall_timeout)"
    assert verdict({"kind": "RunError", "message": line, "ended": 2.0 + STALL + 29}) == "runerror"
    assert verdict({"kind": "RunError", "message": line, "ended": 2.0 + STALL + 31}) == "wrong"
    assert verdict({"kind": "RunError", "message": line + "\nTraceback ...", "ended": 9.0}) == "wrong"
    assert verdict({"kind": "RunError", "message": "", "ended": 9.0}) == "wrong"


def test_any_other_ending_is_wrong_and_no_ending_is_a_hang():
    assert verdict({"kind": "error", "message": "KilledWorker: ..."}) == "wrong"
    assert verdict({"kind": "hang"}) == "hang"


def test_tally_and_passed_count_leftovers_and_bad_store_values_as_failures():
    recs = [{"fault": {"kind": "worker_kill"}, "verdict": "same", "leftovers": [], "store_errors": []},
            {"fault": {"kind": "scheduler_stop"}, "verdict": "runerror", "leftovers": [], "store_errors": []}]
    assert chaos.passed(recs)
    counts = chaos.tally(recs)
    assert counts["worker_kill"]["same"] == 1 and counts["scheduler_stop"]["runerror"] == 1
    assert not chaos.passed(recs + [{"fault": {"kind": "link"}, "verdict": "same", "leftovers": ["4242"], "store_errors": []}])
    assert not chaos.passed(recs + [{"fault": {"kind": "link"}, "verdict": "same", "leftovers": [], "store_errors": ["x.pkl"]}])
    assert not chaos.passed(recs + [{"fault": {"kind": "link"}, "verdict": "hang", "leftovers": [], "store_errors": []}])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), run=st.integers(0, 10**4), stall=st.floats(1, 60))
def test_faults_replay_and_strike_during_the_run(seed, run, stall):
    f = chaos.draw_fault(seed, run, chaos.KINDS, stall)
    assert f == chaos.draw_fault(seed, run, chaos.KINDS, stall)  # --seed/--only replay it
    assert f.kind == chaos.KINDS[run % len(chaos.KINDS)]  # every kind gets its share
    assert 0.05 <= f.share <= 0.7  # of a fault-free run's time: while it runs
    assert f.target in (0, 1)
    if f.kind.endswith("_stop"):
        assert f.hold > stall and f.then in ("cont", "kill")  # stopped past stall_timeout


def test_unknown_fault_kinds_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown fault kind.*disk_full.*choose from"):
        chaos.draw_fault(0, 0, ("worker_kill", "disk_full"), 5)


def test_equal_compares_arrays_exactly_and_empty_cells_alike():
    np = pytest.importorskip("numpy")
    assert chaos._equal({"a": np.arange(3.0), "b": math.nan}, {"a": np.arange(3.0), "b": math.nan})
    assert not chaos._equal({"a": np.arange(3.0)}, {"a": np.arange(3.0) + 1e-12})
    # an empty cell is None or NaN depending on the column's dtype (pandas): both are empty
    assert chaos._equal({"failed_step": None}, {"failed_step": math.nan})
    assert not chaos._equal({"failed_step": "choose('accuracy')"}, {"failed_step": math.nan})
    assert not chaos._equal({"failed_step": "choose('accuracy')"}, {"failed_step": None})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_run_per_fault_kind_ends_right_and_leaves_nothing(tmp_path):
    """The real thing, short: a fault-free run, then one run per kind (link only as root with
    ``ip``: skipped otherwise, said in the output). Every run ends with the fault-free result or
    a clean RunError, leaves no process or namespace, and stores no wrong value."""
    out = tmp_path / "chaos.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--quick", "--seed", "7",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=880,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(proc.stdout[-4000:])
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    bad = [r for r in report["records"] if r["verdict"] not in ("same", "runerror") or r["leftovers"] or r["store_errors"]]
    kept = [Path(tempfile.gettempdir()) / f"chaos-failed-7-{r['run']}" for r in bad]  # a failed run's logs (chaos.campaign)
    logs = "".join(f"\n--- {f}\n" + f.read_text()[-3000:] for d in kept for f in sorted(d.glob("*.log")))
    assert not bad, json.dumps(bad, indent=1)[:6000] + logs[-12000:]
    assert report["passed"] and proc.returncode == 0
    kinds = {r["fault"]["kind"] for r in report["records"]}
    assert kinds >= {"worker_kill", "worker_kill2", "worker_stop", "scheduler_stop"}
    assert "link" in kinds or "skipping link" in proc.stdout


def test_a_campaign_in_parts_is_counted_as_one_and_refuses_mismatched_parts():
    def part(runs, seed=0, verdict="same"):
        recs = [{"run": i, "fault": {"kind": "worker_kill"}, "verdict": verdict, "leftovers": [], "store_errors": [], "fault_at": 1.0}
                for i in runs]
        return {"seed": seed, "stall_timeout": 5.0, "kinds": ["worker_kill"], "records": recs, "fault_free_seconds": 9.0,
                "wall_seconds": 10.0, "commands": ["x"], "load_average": [1.0, 1.0, 1.0], "counts": chaos.tally(recs),
                "passed": chaos.passed(recs), "runs": len(recs)}

    merged = chaos.merge(part([0, 1]), part([2], verdict="hang"))
    assert merged["runs"] == 3 and [r["run"] for r in merged["records"]] == [0, 1, 2]
    assert merged["counts"]["worker_kill"] == {"runs": 3, "same": 2, "runerror": 0, "hang": 1, "wrong": 0, "leftovers": 0, "bad_store": 0, "missed": 0}
    assert not merged["passed"] and merged["wall_seconds"] == 20.0
    with pytest.raises(SystemExit, match="seed"):
        chaos.merge(part([0]), part([1], seed=1))
    with pytest.raises(SystemExit, match=r"run\(s\) \[1\] are already"):
        chaos.merge(part([0, 1]), part([1]))
