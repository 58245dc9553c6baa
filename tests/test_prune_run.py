"""Pruning chooses in real runs (docs/architecture.md §7.2): a LocalCluster of 2 single-threaded
worker processes, generator steps with scripted curves that leave marks in files (when they
started, when their generator was closed and after how many reports), so what happened is
read back without clocks or timed assertions."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from pipelines import Pipeline, grid, halving
from pipelines.export import payload
from tests import prune_steps as ps
from tests.rule_check import check_rule

pytestmark = pytest.mark.slow  # pruned training runs

BEST = ("best", (0.6, 0.7, 0.75, 0.8, 0.82, 0.84, 0.86, 0.88, 0.9, 0.91, 0.92, 0.93))
CURVES = [
    BEST,
    ("mid", (0.5, 0.55, 0.6, 0.62, 0.64, 0.66, 0.68, 0.7, 0.72)),
    ("low", (0.2,) * 9),
    ("late", (0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.87, 0.89, 0.9)),
    ("low2", (0.3,) * 9),
    ("low3", (0.25,) * 9),
]


def exploration(log_dir, curves=CURVES, delay=0.03, pid=False, **choose):
    node = Pipeline("prune").source(ps.data)
    if "per" in choose:
        node = node.explore("g", grid(ps.tag, g=["x", "y"]))
    node = node.explore("c", grid(ps.curve, spec=list(curves), log_dir=[str(log_dir)], delay=[delay], pid=[pid]))
    choose.setdefault("prune", halving(factor=3))
    return node.choose("score", **choose)


def closed_marks(log_dir, n, wait=20.0):
    """The closed marks, once ``n`` are there (a cancelled step closes at its next iteration)."""
    end = time.monotonic() + wait
    while len(ps.events(log_dir, "closed")) < n and time.monotonic() < end:
        time.sleep(0.05)
    return dict(ps.events(log_dir, "closed"))


def test_scripted_curves_are_pruned_at_the_rungs_of_the_rule_and_free_their_workers(client, tmp_path, capsys):
    result = exploration(tmp_path).run(client, progress=True)
    stopped_at = check_rule(result, factor=3)
    names = [spec[0] for spec in CURVES]
    assert stopped_at, "nothing was pruned"
    # the best curve leads at every rung: it always continues, runs its 12 reports, is chosen
    assert result.table.loc[0, "chosen"] and result.table.loc[0, "iterations"] == 12 and result.value["name"] == "best"
    # every generator was closed (its finally ran), a pruned one right after its rung's report
    closed = closed_marks(tmp_path, len(CURVES))
    for i, name in enumerate(names):
        assert int(closed[name]) == result.table.loc[i, "iterations"], name
    # the history is each branch's reports, as the table counts them
    for i, (name, values) in enumerate(CURVES):
        assert [h["score"] for h in result.history[i]] == list(values[: result.table.loc[i, "iterations"]])
    # a worker freed by a pruned branch took another one while the best was still running
    marks = sorted((f.split("-")[1], kind, f.split("-", 3)[3])  # by their ns stamps, across processes
                   for kind in ("start", "closed") for f in os.listdir(tmp_path) if f.startswith(kind + "-"))
    order = [(kind, name) for _, kind, name in marks]
    best_end = order.index(("closed", "best"))
    pruned = {names[i] for i in stopped_at}
    running = 0
    picked = False
    for pos, (kind, name) in enumerate(order):
        running += 1 if kind == "start" else -1
        assert running <= 2  # two single-threaded workers
        if kind == "start" and pos < best_end and any(("closed", p) in order[:pos] for p in pruned):
            picked = True
    assert picked, order
    # stats and the progress line
    s = result.stats
    assert s["reports"] == result.table["iterations"].sum() and s["pruned_branches"] == len(stopped_at)
    assert s["rungs"] == len(result.rungs) and s["time_to_first_rung_s"] > 0 and 0 < s["busy_fraction"] <= 1
    assert "at rung 0" in capsys.readouterr().err
    # strict JSON carries iterations and the history of every row
    data = json.loads(json.dumps(payload(result.table, result.stats, compiled=result.compiled), allow_nan=False))
    assert [r["iterations"] for r in data["table"]] == list(result.table["iterations"])
    assert [r["history"] for r in data["table"]] == result.history


def test_per_groups_halve_separately_and_a_failing_branch_blocks_no_rung(client, tmp_path):
    # fail1 raises before its first report; fail3 reports twice (unless pruned first), then raises
    curves = [BEST, ("fail1", (0.1,) * 6), ("low", (0.2,) * 6), ("fail3", (0.05,) * 6)]
    result = exploration(tmp_path, curves=curves, delay=0.01, per="g", prune=halving(factor=2, max_iter=6)).run(client)
    t = result.table
    stopped_at = check_rule(result, factor=2)
    assert {e["group"] for e in result.rungs} == {("tag", (("g", "x"),)), ("tag", (("g", "y"),))}
    name = t["c.spec"].map(lambda s: s[0])
    assert list(t["status"][name == "fail1"]) == ["failed", "failed"]
    assert set(t["status"][name == "fail3"]) <= {"failed", "pruned"}
    # max_iter=6: the best stops after 6 reports, finished (not pruned), and is chosen in each group
    best = t[t["c.spec"].map(lambda s: s[0]) == "best"]
    assert list(best["iterations"]) == [6, 6] and list(best["chosen"]) == [True, True]
    assert all(t.loc[i, "c.spec"][0] != "best" for i in stopped_at)
    closed_marks(tmp_path, 8)
    assert len(ps.events(tmp_path, "closed")) == 8  # every generator closed, failed ones too


def test_k_and_threshold_cancel_the_rest_and_their_generators_close(client, tmp_path):
    curves = [("slow", (0.5,) * 40), BEST, ("high", (0.95,) * 4), ("low", (0.1,) * 40)]
    result = exploration(tmp_path, curves=curves, delay=0.02, k=1, threshold=0.9,
                         prune=halving(factor=3, min_iter=2)).run(client)
    t = result.table
    assert t["chosen"].sum() == 1 and t.loc[t["chosen"], "score"].iloc[0] >= 0.9
    assert set(t["status"]) <= {"ok", "pruned", "dropped", "cancelled"}
    started = ps.events(tmp_path, "start")
    closed = closed_marks(tmp_path, len(started))
    assert len(closed) == len(started)  # every started generator was closed, cancelled ones too
    for i, row in t.iterrows():
        name = curves[i][0]
        if row["status"] == "pruned":
            assert int(closed[name]) == row["iterations"]
        elif name in closed:  # a cancelled one may have reported once more while the run ended
            assert int(closed[name]) >= row["iterations"]


def test_a_pruned_branch_stores_nothing_and_reruns_next_time(client, tmp_path):
    logs, store = tmp_path / "logs", tmp_path / "store"
    logs.mkdir()
    first = exploration(logs, delay=0.01).run(client, store=str(store))
    pruned = set(first.table.index[first.table["status"] == "pruned"])
    assert pruned and first.stats["saved_to_store"] > 0
    from graph.tasks.store import ResultStore

    kept = ResultStore(store)
    keys = [b.key for b in first.compiled.branches]
    assert {i for i, k in enumerate(keys) if k not in kept} == pruned  # finished branches' values are stored
    for f in os.listdir(logs):
        os.remove(logs / f)
    second = exploration(logs, delay=0.01).run(client, store=str(store))
    rerun = {name for name, _ in ps.events(logs, "start")}
    assert rerun == {CURVES[i][0] for i in pruned}  # only the pruned ones run again
    assert second.value["name"] == "best"


def test_a_worker_killed_during_a_pruning_exploration_gives_the_same_decisions(tmp_path):
    """SIGKILL the worker running the best branch once pruning has begun: Dask reruns its
    generator, whose replayed reports are not counted again (the rungs' answers are already on
    the scheduler), the rule holds on the run's arrivals and the same branch is chosen."""
    from distributed import Client, LocalCluster

    node = exploration(tmp_path, delay=0.05, pid=True)
    killed = []

    def kill_the_best_once_pruning_began(stop):
        while not stop.is_set() and not killed:
            starts = dict(ps.events(tmp_path, "start"))
            closed = dict(ps.events(tmp_path, "closed"))
            made = sum(1 for n, _ in ps.events(tmp_path, "iter") if n == "best")
            if made >= 4 and "best" not in closed and set(closed) - {"best"}:  # past its rung at 3
                os.kill(int(starts["best"]), signal.SIGKILL)
                killed.append(int(starts["best"]))
                return
            time.sleep(0.01)

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        stop = threading.Event()
        killer = threading.Thread(target=kill_the_best_once_pruning_began, args=(stop,), daemon=True)
        killer.start()
        try:
            result = node.run(c)
        finally:
            stop.set()
            killer.join(5)
    assert killed, "the best branch finished before pruning began"
    assert [n for n, _ in ps.events(tmp_path, "start")].count("best") == 2  # Dask reran its generator
    check_rule(result, factor=3)
    assert result.value["name"] == "best" and result.table.loc[0, "iterations"] == 12
    assert result.stats["reports_replayed"] > 0 and result.stats["reports"] == result.table["iterations"].sum()
    assert [h["step"] for h in result.history[0]] == list(range(1, 13))  # no report counted twice


def test_the_dashboard_shows_iterations_and_where_branches_were_pruned(client, tmp_path):
    """The exploration page's columns, and the training page's report curves: live while the
    run goes, then each branch's reports of the choose metric, the rungs, and an x where each
    pruned branch stopped (the JSON endpoint, polled during the run, and the page's sources)."""
    from graph.dashboard.pages import ExplorationPage, TrainingPage
    from tests.test_dashboard import run_watching, state

    result, seen = run_watching(client, exploration(tmp_path, delay=0.15))  # ~2 s: several updates
    run = state(client)["runs"][-1]
    t = result.table
    # live: while the run was running, the endpoint already showed curves of reports made so far
    live = [r["curves"] for s in seen for r in s.get("runs", ())
            if r["run"] == run["run"] and r["state"] == "running" and r.get("curves")]
    assert live, "no report curve was shown while the run ran"
    assert any(len(b["curve"]) < t.loc[b["id"], "iterations"] for c in live for b in c["branches"])
    # after: every branch's curve is its history's metric; the rungs of halving(factor=3) up to 12
    curves = run["curves"]
    assert curves["metric"] == "score" and curves["rungs"] == [1, 3, 9]
    assert {b["id"]: b["curve"] for b in curves["branches"]} == {
        i: [h["score"] for h in result.history[i]] for i in t.index}
    page = TrainingPage(scheduler=None)
    page.show_reports(curves)
    marks = page.report_sources["marks"].data
    pruned = t[t["status"] == "pruned"]
    assert len(pruned) and sorted(marks["x"]) == sorted(pruned["iterations"])
    assert sorted(marks["y"]) == sorted(result.history[i][-1]["score"] for i in pruned.index)
    assert [b["iterations"] for b in run["branches"]] == list(t["iterations"])
    assert [b["pruned_at"] for b in run["branches"]] == [
        int(r["iterations"]) if r["status"] == "pruned" else None for _, r in t.iterrows()]
    page = ExplorationPage(scheduler=None)
    page._table(run)
    data = page.table_source.data
    assert data["iterations"] == list(t["iterations"])
    assert data["pruned at"] == ["" if b["pruned_at"] is None else f"iteration {b['pruned_at']}" for b in run["branches"]]
    assert data["last report"] == [result.history[i][-1]["score"] for i in t.index]  # the curve's latest point


def test_pruning_under_a_memory_budget_with_a_sampling_pass(tmp_path):
    """The budget's sampling pass runs the first branch alone, then the rest: the rung
    decisions still follow the rule on the run's arrivals, and the best is chosen.
    Its own embedded cluster: the module's shared workers have grown by the earlier tests (a CI
    run measured them at 0.92 GiB "idle", refusing a 2 GiB budget)."""
    result = exploration(tmp_path, delay=0.01).run(workers=2, memory_budget="2 GiB", sample_sizes=True,
                                                   quiet=True, progress=False)
    stopped_at = check_rule(result, factor=3)
    assert stopped_at and result.value["name"] == "best"
    assert "spilled_bytes" in result.stats and result.stats["pruned_branches"] == len(stopped_at)


def test_a_run_whose_cleanup_raises_leaves_no_report_channel_open(client, tmp_path):
    """The run's report channel is closed first when the run ends, so a cleanup step that raises
    after it (here: an ``on_driver`` watcher's ``close``) does not leave the channel open, which
    would refuse every later run on the client (one channel per client)."""
    from graph.run.executor import execute

    class Watcher:
        def close(self):
            raise OSError("watcher could not close")

    node = exploration(tmp_path, curves=CURVES[:3], delay=0.0)
    with pytest.raises(OSError, match="watcher could not close"):
        execute(node.compile(), client, progress=False, on_driver=lambda driver: Watcher())
    result = exploration(tmp_path, curves=CURVES[:3], delay=0.0).run(client)  # the next run on this client
    assert result.value["name"] == "best"


def test_branch_seconds_count_what_branches_computed_not_their_waits_or_shared_steps_twice(client, tmp_path):
    """Six iterative branches behind one slow shared source, halving on 2 single-threaded workers:
    the ``seconds`` column adds up to no more than the workers could compute in the run's wall time
    (the source counts once across the branches, waits at rungs not at all)."""
    node = Pipeline("seconds").source(ps.slow_data, seconds=2.0)
    node = node.explore("c", grid(ps.curve, spec=list(CURVES), log_dir=[str(tmp_path)], delay=[0.05]))
    result = node.choose("score", prune=halving(factor=3)).run(client, progress=False, quiet=True)
    t = result.table
    assert (t["status"] == "pruned").any()
    assert t["seconds"].sum() <= 2 * result.stats["wall_seconds"], (t["seconds"].tolist(), result.stats["wall_seconds"])
    assert (t["seconds"] >= 2.0 / len(t)).all()  # each branch's share of the source is in


def test_rungs_is_an_empty_list_when_no_choose_prunes(client, tmp_path):
    result = exploration(tmp_path, prune=None).run(client, progress=False, quiet=True)
    assert result.rungs == [] and "iterations" in result.table
