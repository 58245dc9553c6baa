"""Quiver's dashboard pages and JSON endpoint on a real LocalCluster, the preload, loopback default."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines import Pipeline, grid
from tests import steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # slow: scheduler pages over HTTP during runs

ROOT = Path(__file__).resolve().parents[1]


def base_url(client) -> str:
    return client.dashboard_link.rsplit("/", 1)[0]


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def state(client, run: str | None = None) -> dict:
    url = base_url(client) + "/quiver/api/state.json" + (f"?run={run}" if run else "")
    return json.loads(get(url))


def sleepy_exploration(name="watch", seconds=(0.4, 0.8)):
    src = Pipeline(name).source(steps.source, seed=1)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3]))
    s = a.explore("s", grid(steps.sleep_then, seconds=list(seconds)))
    return s.choose("x", mode="max")


def run_watching(client, node, poll=0.1):
    """Run ``node`` while polling the JSON endpoint; return (result, snapshots of that run)."""
    seen: list[dict] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                seen.append(state(client))
            except Exception as exc:  # noqa: BLE001 - record, the assertions will tell
                seen.append({"error": repr(exc)})
            time.sleep(poll)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        result = node.run(client, progress=False, quiet=True)
    finally:
        done.set()
        t.join()
    return result, seen


def test_json_endpoint_during_and_after_a_real_run(client):
    result, seen = run_watching(client, sleepy_exploration())
    final = state(client)
    run = final["runs"][-1]
    assert run["name"] == "watch" and run["state"] == "finished"
    # during the run: the run was listed as running, with branches running or waiting
    live = [r for s in seen if "runs" in s for r in s["runs"] if r["run"] == run["run"] and r["state"] == "running"]
    assert live, "the endpoint never showed the run while it ran"
    statuses = {b["status"] for r in live for b in r["branches"]}
    assert "running" in statuses and statuses <= {"waiting", "running", "done", "chosen"}
    # after: one row per branch of the table, same metric, same chosen branch
    table = result.table
    assert len(run["branches"]) == len(table)
    for b in run["branches"]:
        row = table.loc[b["id"]]
        assert b["metrics"]["x"] == pytest.approx(row["x"])
        assert b["status"] == ("chosen" if row["chosen"] else "done")
        assert b["choices"] == {"a": f"add(n={row['a.n']})", "s": f"sleep_then(seconds={row['s.seconds']})"}
    assert run["chosen"] == list(table.index[table["chosen"]])
    assert run["best"] == {"metric": "x", "value": 4.0, "branch": run["chosen"][0]}
    assert run["stats"]["executed_tasks"] == result.stats["executed_tasks"]
    # ?run= selects one run
    assert [r["run"] for r in state(client, run["run"])["runs"]] == [run["run"]]


def test_failed_and_pruned_branches_are_reported(client):
    src = Pipeline("fails").source(steps.source, seed=1)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3]))
    checked = a.then(steps.fail_on, bad=3)  # seed 1 + 2 = 3 fails
    best = checked.choose("x", mode="max").then(steps.mul, n=2)
    result = best.run(client, progress=False, quiet=True)
    run = state(client)["runs"][-1]
    got = {b["id"]: b["status"] for b in run["branches"]}
    want = {i: ("chosen" if r.chosen else "done" if r.status == "ok" else r.status) for i, r in result.table.iterrows()}
    assert got == want
    assert "failed" in got.values() and "dropped" in got.values() and "chosen" in got.values()
    failed = next(b for b in run["branches"] if b["status"] == "failed")
    assert "refusing x=3" in failed["error"]
    # its story: the state machine's last handlings naming its tasks, its failure among them (a
    # handling may take several events at once, named after its first)
    story = failed["story"]
    assert 2 <= len(story) <= 12
    assert any("TaskFailed" in e and "refusing x=3" in e for entry in story for e in entry["events"])
    assert all(b["story"] == [] for b in run["branches"] if b["status"] != "failed")


def test_pages_are_served_and_linked_from_the_dashboard(client):
    sleepy_exploration(name="links", seconds=(0.01,)).run(client, progress=False, quiet=True)
    base = base_url(client)
    status_page = get(base + "/status").decode()
    assert 'href="quiver-exploration"' in status_page and 'href="quiver-training"' in status_page
    for page in ("quiver-exploration", "quiver-training"):
        body = get(f"{base}/{page}").decode()
        assert "Quiver" in body and "bokeh" in body.lower()  # a Bokeh document in Dask's template
    assert client.run_on_scheduler(lambda dask_scheduler: "quiver-dashboard" in dask_scheduler.plugins)


def test_training_curves_are_published(client, capsys):
    gpu = pytest.importorskip("gpu")
    mlp = functools.partial(gpu.MLP, 64, 10, hidden=(32,))
    runs = (
        Pipeline("dash-train")
        .source(gpu.load_digits_tensors, seed=0)
        .explore("train", grid(gpu.train, model=[mlp], lr=[0.05, 0.1], epochs=[2], replicas=["auto"], max_replicas=[2]))
    )
    result = runs.choose("accuracy").run(client, progress=True, quiet=True)
    err = capsys.readouterr().err
    run = state(client)["runs"][-1]
    assert run["name"] == "dash-train" and len(run["chosen"]) == 1
    training = state(client, run["run"])["training"]
    assert len(training) == 2
    for t in training:
        assert t["state"] == "done" and t["algorithm"] == "sma"
        assert len(t["branches"]) == 1 and t["label"].startswith(f"#{t['branches'][0]}")
        assert [e["epoch"] for e in t["epochs"]] == [1, 2]
        last = t["epochs"][-1]
        row = result.table.loc[t["branches"][0]]
        assert last["accuracy"] == pytest.approx(row["accuracy"])
        for f in ("test_loss", "spread", "samples_per_s", "compute_s", "sync_s", "replicas"):
            assert last[f] is not None
        assert len(t["workers"]) == 2  # both gang members reported their replica count
        assert t["tuning"] and t["tuning"][0][0] == 1
    assert "train epoch" in err  # the terminal line showed training progress


def test_topic_names_agree():
    from graph.dashboard.protocol import TRAINING_TOPIC
    from gpu.training import TRAINING_TOPIC as GPU_TOPIC

    assert TRAINING_TOPIC == GPU_TOPIC


def test_embedded_cluster_dashboard_listens_on_loopback():
    from graph.cluster.connect import connect

    with connect(n_workers=1, quiet=True) as c:
        assert c.dashboard_link.startswith("http://127.0.0.1:")
        sockets = c.cluster.scheduler.http_server._sockets.values()
        hosts = {s.getsockname()[0] for s in sockets}
        assert hosts == {"127.0.0.1"}, hosts


def test_preload_on_an_external_scheduler(tmp_path):
    sched_file = tmp_path / "scheduler.json"
    dask = str(Path(sys.executable).with_name("dask"))
    cmd = [dask, "scheduler", "--preload", "graph.dashboard", "--host", "127.0.0.1", "--port", "0",
           "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert sched_file.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no scheduler file"
        info = json.loads(sched_file.read_text())
        base = f"http://127.0.0.1:{info['services']['dashboard']}"
        deadline = time.time() + 10
        while True:
            try:
                data = json.loads(get(base + "/quiver/api/state.json"))
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        assert data["runs"] == [] and data["training"] == []
        assert 'href="quiver-exploration"' in get(base + "/status").decode()
        assert b"Quiver" in get(base + "/quiver-exploration")
    finally:
        proc.terminate()
        proc.wait(10)


class FakeClient:
    """Records what a run would publish / subscribe to."""

    def __init__(self):
        self.events = []
        self.topics = []

    def log_event(self, topic, msg):
        self.events.append((topic, msg))

    def subscribe_topic(self, topic, handler):
        self.topics.append(topic)

    def unsubscribe_topic(self, topic):
        self.topics.remove(topic)


def test_big_explorations_publish_a_summary_only(monkeypatch):
    import graph
    import graph.dashboard.protocol as events

    node = sleepy_exploration(name="big", seconds=(0.1, 0.2))
    compiled = graph.compile(node)
    monkeypatch.setattr(events, "MAX_PUBLISHED_BRANCHES", 3)
    fake = FakeClient()
    pub = events.ExplorationPublisher(fake, "r-big", compiled)
    pub.start()
    pub.finish([], {"wall_seconds": 1.0})
    (t1, start), (t2, end) = fake.events
    assert t1 == t2 == events.EXPLORATION_TOPIC
    assert start["branches"] == [] and start["total_branches"] == 6
    assert end["kind"] == "end" and end["branches"] == []
    from graph.dashboard import QuiverDashboard

    plugin = QuiverDashboard()
    plugin.log_event(t1, start)
    plugin.log_event(t2, end)
    run = plugin.snapshot()["runs"][0]
    assert run["total_branches"] == 6 and run["state"] == "finished"


def test_terminal_training_line_only_when_progress_is_shown():
    import io

    from graph.dashboard.protocol import TRAINING_TOPIC, TrainingWatch
    from graph.report.progress import Progress

    quiet, fake = Progress(enabled=None, stream=io.StringIO()), FakeClient()  # not a terminal: quiet
    assert not TrainingWatch(fake, quiet).subscribed and fake.topics == []
    out = io.StringIO()
    shown = Progress(enabled=True, stream=out)
    watch = TrainingWatch(fake, shown)
    assert fake.topics == [TRAINING_TOPIC]
    watch.on_event((0.0, {"kind": "epoch", "rank": 1, "epoch": 9}))  # other ranks are not shown
    assert shown.extra == ""
    watch.on_event((0.0, {"kind": "epoch", "rank": 0, "epoch": 2, "epochs": 4, "accuracy": 0.91, "samples_per_s": 5210.0}))
    shown.update(tasks_done=1, tasks_total=2, branches_done=0, branches_total=2, force=True)
    assert "train epoch 2/4 acc 0.910 5,210 samples/s" in out.getvalue()
    watch.close()
    assert fake.topics == []


def test_table_escapes_names_and_keeps_fixed_columns_apart():
    from graph.dashboard.pages import ExplorationPage

    page = ExplorationPage(scheduler=None)
    evil = "<img src=x onerror=alert(1)>"
    run = {
        "explores": [evil],
        "branches": [
            {"id": i, "labels": {evil: "a"}, "params": {f"{evil}.p": i}, "metrics": {"error": 0.1 * i},
             "status": "chosen" if i else "done", "error": None}
            for i in range(3)
        ],
    }
    page._table(run)
    titles = [c.title for c in page.table.columns]
    assert all("<img" not in t for t in titles) and any("&lt;img" in t for t in titles)
    data = page.table_source.data
    assert len({len(v) for v in data.values()}) == 1  # a metric called "error" does not clash
    assert data["m:error"] == [0.0, 0.1, 0.2] and data["error"] == ["", "", ""]
    assert "story" not in [c.field for c in page.table.columns]  # no failed branch: no story column


def test_a_failed_branchs_story_is_a_column_and_in_its_hover():
    from graph.dashboard.pages import ExplorationPage, _branch_info

    story = [{"stimulus": f"s{i}", "events": [], "instructions": []} for i in range(8)]
    branches = [{"id": 0, "labels": {}, "params": {}, "metrics": {}, "status": "failed", "error": "ValueError: x",
                 "story": story},
                {"id": 1, "labels": {}, "params": {}, "metrics": {}, "status": "chosen", "error": None, "story": []}]
    page = ExplorationPage(scheduler=None)
    page._table({"explores": [], "branches": branches})
    assert [c.field for c in page.table.columns][-1] == "story"
    assert page.table_source.data["story"] == ["… → s2 → s3 → s4 → s5 → s6 → s7", ""]
    assert _branch_info(branches[0]).endswith("story: … → s2 → s3 → s4 → s5 → s6 → s7")


def test_reruns_of_one_pipeline_stay_cheap_and_training_follows_the_newest_run():
    from graph.dashboard import QuiverDashboard
    from graph.dashboard.protocol import EXPLORATION_TOPIC, TRAINING_TOPIC

    plugin = QuiverDashboard(max_runs=3)
    branches = [{"id": i, "key": f"k{i}", "choices": [], "lineage": ["load", f"train-{i}"]} for i in range(50)]
    for n in range(6):  # the same keys every time (deterministic keys), more runs than kept
        plugin.log_event(EXPLORATION_TOPIC, {"kind": "start", "run": f"r{n}", "branches": branches})
        plugin.log_event(TRAINING_TOPIC, {"kind": "epoch", "task": "train-0", "epoch": 1, "accuracy": n / 10})
    assert list(plugin.runs) == ["r3", "r4", "r5"]
    assert {r for r, _ in plugin.branches_of("load")} == {"r3", "r4", "r5"}
    view = plugin.training_view(plugin.training["train-0"])
    assert view["run"] == "r5" and view["branches"] == [0]
    assert [e["accuracy"] for e in view["epochs"]] == [0.5]  # the rerun's curve only


def test_live_updates_cost_a_bounded_share_of_the_run_and_send_only_changes():
    """Sending an update costs client time; after a send that took t seconds the publisher
    waits t / share before the next, and it sends only the branches that changed since (rows
    come from the state machine's ``changes()``). A fake clock: no timing in the test."""
    from types import SimpleNamespace

    import graph.dashboard.protocol as events

    now = [100.0]
    sent = []
    compiled = SimpleNamespace(branches=[object(), object()])
    pub = events.ExplorationPublisher(FakeClient(), "r", compiled, interval=0.5, share=0.05, clock=lambda: now[0],
                                      naive_tasks=2, unique_tasks=2)

    def send(msg):  # one send "takes" 1 s of the fake clock
        sent.append(msg)
        now[0] += 1.0

    pub._send = send
    pub.update([(0, "running", {}, None), (1, "waiting", {}, None)], tasks_done=1)
    assert [[b["id"] for b in m["branches"]] for m in sent] == [[0, 1]]
    now[0] += 10.0  # 11 s after a 1 s send: below 1 / 0.05 = 20 s, not sent again
    pub.update([(1, "running", {}, None)], tasks_done=2)
    assert len(sent) == 1 and not pub.due()
    now[0] += 10.0
    pub.update([], tasks_done=3)
    assert len(sent) == 2 and sent[-1]["branches"] == [{"id": 1, "status": "running", "metrics": {}, "error": None}]
    assert sent[-1]["tasks_done"] == 3
    assert "tasks_submitted" not in sent[-1]  # nothing reads it: not sent
    pub.update([], force=True)  # nothing queued: a forced update sends nothing
    assert len(sent) == 2


def test_a_runs_record_shares_what_its_branches_have_in_common():
    """Events arrive deserialized (one string object per occurrence); the plugin keeps one object
    per distinct key, choice and label, so a 4,000-branch run does not hold 4,000 copies of each."""
    import pickle

    from graph.dashboard import QuiverDashboard
    from graph.dashboard.protocol import EXPLORATION_TOPIC

    msg = {"kind": "start", "run": "r", "branches": [
        {"id": i, "key": f"fit-{i}", "choices": [["scaler", "standard", {}], ["model", "svc", {"C": i}]],
         "lineage": ["load-0", "standard-0", f"fit-{i}"], "gates": []} for i in range(3)]}
    plugin = QuiverDashboard()
    plugin.log_event(EXPLORATION_TOPIC, pickle.loads(pickle.dumps(msg)))
    a, b = plugin.runs["r"]["branches"][:2]
    assert a["lineage"][0] is b["lineage"][0] and a["lineage"][1] is b["lineage"][1]
    assert a["choices"]["scaler"] is b["choices"]["scaler"] == "standard"
    assert a["choices"]["model"] == "svc(C=0)" and b["params"] == {"model.C": 1}
    assert plugin.branches_of("standard-0") == [("r", 0), ("r", 1), ("r", 2)]
    assert plugin.branches_of("fit-2") == [("r", 2)]


def test_report_curves_travel_as_deltas_under_the_throttle():
    """An iterative run's rows carry each branch's whole report curve (the state machine's
    ``changes()``); the publisher sends only the points not sent before (``curve``, from
    ``curve_at``), so what a throttled branch made meanwhile still arrives, once."""
    from types import SimpleNamespace

    import graph.dashboard.protocol as events

    now = [100.0]
    sent = []
    compiled = SimpleNamespace(branches=[object(), object()])
    pub = events.ExplorationPublisher(FakeClient(), "r", compiled, interval=0.5, share=0.05, clock=lambda: now[0],
                                      naive_tasks=2, unique_tasks=2)
    pub._send = sent.append
    pub.update([(0, "running", {}, None, 2, None, (0.5, 0.6)), (1, "running", {}, None, 1, None, (0.2,))])
    assert [(b["id"], b["curve"], b["curve_at"], b["iterations"]) for b in sent[0]["branches"]] == [
        (0, [0.5, 0.6], 0, 2), (1, [0.2], 0, 1)]
    now[0] += 0.1  # throttled: both rows are queued, the later one replaces the earlier
    pub.update([(0, "running", {}, None, 3, None, (0.5, 0.6, 0.7))])
    pub.update([(0, "running", {}, None, 4, None, (0.5, 0.6, 0.7, float("nan")))])
    assert len(sent) == 1
    now[0] += 1.0
    pub.update([(1, "pruned", {}, None, 1, 1, (0.2,))])
    by_id = {b["id"]: b for b in sent[1]["branches"]}
    assert (by_id[0]["curve"], by_id[0]["curve_at"]) == ([0.7, None], 2)  # NaN travels as null
    assert "curve" not in by_id[1] and by_id[1]["pruned_at"] == 1  # nothing new on its curve


def test_the_plugin_keeps_report_curves_and_draws_rungs_and_pruned_ends():
    from graph.dashboard import QuiverDashboard
    from graph.dashboard.pages import TrainingPage
    from graph.dashboard.protocol import EXPLORATION_TOPIC

    plugin = QuiverDashboard()
    prune = {"factor": 3, "min_iter": 1, "max_iter": None}
    plugin.log_event(EXPLORATION_TOPIC, {
        "kind": "start", "run": "r", "name": "curves", "curve_choose": 1,
        "chooses": [{"index": 0, "metric": "other", "mode": "max", "prune": None},
                    {"index": 1, "metric": "score", "mode": "max", "prune": prune}],
        "branches": [{"id": i, "key": f"k{i}", "choices": [["c", f"n{i}", {}]], "lineage": [f"k{i}"]} for i in range(3)],
    })
    run = plugin.runs["r"]
    assert plugin.curves_view(run) is None  # nothing reported yet
    upd = lambda *bs: plugin.log_event(EXPLORATION_TOPIC, {"kind": "update", "run": "r", "branches": list(bs)})  # noqa: E731
    upd({"id": 0, "status": "running", "iterations": 2, "curve": [0.5, 0.6], "curve_at": 0},
        {"id": 1, "status": "running", "iterations": 1, "curve": [0.2], "curve_at": 0})
    upd({"id": 0, "status": "running", "iterations": 4, "curve": [0.7, 0.8], "curve_at": 2},
        {"id": 1, "status": "pruned", "iterations": 1, "pruned_at": 1})
    upd({"id": 0, "status": "running", "iterations": 4, "curve": (0.8,), "curve_at": 3})  # resent (msgpack: a tuple)
    view = plugin.curves_view(run)
    assert view["metric"] == "score" and view["rungs"] == [1, 3]  # PruneSpec.rungs up to the longest curve
    assert [(b["id"], b["curve"], b["pruned_at"]) for b in view["branches"]] == [
        (0, [0.5, 0.6, 0.7, 0.8], None), (1, [0.2], 1)]
    assert plugin.snapshot("r")["runs"][0]["curves"] == view  # the JSON endpoint carries them
    page = TrainingPage(scheduler=None)
    line = page.show_reports(view)
    assert page.reports.visible and "score" in page.reports.title.text and "rungs at iterations 1, 3" in line
    marks = page.report_sources["marks"].data
    assert (marks["x"], marks["y"]) == ([1], [0.2])  # the pruned branch ends with an x where it stopped
    assert page.report_sources["lines"].data["dash"] == ["solid", "dashed"]
    assert page.report_sources["rungs"].data["x0"] == [1, 3]


def test_the_training_page_names_each_curves_configuration_and_shows_only_panels_with_data():
    """Report curves carry the branch's choices (legend and hover); the six gpu.train panels stay
    hidden for a run without gpu.train and appear when a training branch reports epochs."""
    from types import SimpleNamespace

    from graph.dashboard import QuiverDashboard
    from graph.dashboard.pages import TrainingPage
    from graph.dashboard.protocol import EXPLORATION_TOPIC, PLUGIN_NAME, TRAINING_TOPIC

    plugin = QuiverDashboard()
    plugin.log_event(EXPLORATION_TOPIC, {
        "kind": "start", "run": "r", "name": "curves", "curve_choose": 0,
        "chooses": [{"index": 0, "metric": "score", "mode": "max", "prune": {"factor": 3, "min_iter": 1, "max_iter": None}}],
        "branches": [{"id": i, "key": f"k{i}", "choices": [["fit", "fit", {"lr": lr}]], "lineage": [f"k{i}"]}
                     for i, lr in enumerate((0.1, 0.01))],
    })
    plugin.log_event(EXPLORATION_TOPIC, {"kind": "update", "run": "r", "branches": [
        {"id": 0, "status": "running", "iterations": 2, "curve": [0.5, 0.6], "curve_at": 0},
        {"id": 1, "status": "pruned", "iterations": 1, "pruned_at": 1, "curve": [0.2], "curve_at": 0}]})
    page = TrainingPage(scheduler=SimpleNamespace(plugins={PLUGIN_NAME: plugin}))
    page.update(force=True)
    labels = page.report_sources["lines"].data["label"]
    assert labels == ["#0 lr=0.1 (running)", "#1 lr=0.01 (pruned)"]  # what differs (graph.labels), not fit(...)
    assert page.reports.visible and page.reports.legend.visible
    assert page.reports.legend[0] in page.reports.below  # under the plot: it never covers a curve
    assert not any(fig.visible for fig in page.panels.values())  # no gpu.train: no empty panels
    plugin.log_event(TRAINING_TOPIC, {"kind": "epoch", "task": "k0", "epoch": 1, "accuracy": 0.9, "samples_per_s": 100.0})
    page.update(force=True)
    assert {k for k, fig in page.panels.items() if fig.visible} == {"accuracy", "samples_per_s"}
    # a plain gpu.Loop: no model averaging, so no "of z" titles and no replica panels
    plugin.log_event(TRAINING_TOPIC, {"kind": "start", "task": "k1", "algorithm": "loop", "epochs": 2})
    plugin.log_event(TRAINING_TOPIC, {"kind": "epoch", "task": "k1", "epoch": 1, "accuracy": 0.8, "test_loss": 0.5,
                                      "replicas": 1, "samples_per_s": 90.0})
    page.update(force=True)
    assert page.panels["accuracy"].title.text == "Accuracy (test split)" and not page.panels["replicas"].visible
    assert "of z" not in page.header.text and "#1 lr=0.01" in page.header.text
    plugin.log_event(TRAINING_TOPIC, {"kind": "start", "task": "k0", "algorithm": "sma", "epochs": 2})
    page.update(force=True)
    assert page.panels["accuracy"].title.text == "Accuracy of z (test split)"  # gpu.train's model averaging


@pytest.mark.parametrize("n, explores", [(112, (2, 4, 14)), (112, (112,)), (2000, (4, 10, 50)), (2000, (2000,))])
def test_the_explore_tree_gives_every_label_a_row_of_its_own_at_112_and_2000_branches(n, explores):
    """Labels in one column are at least a row apart (the page gives a row 16 px for 9 px text);
    above MAX_ROWS branches, nodes stand for the branches under them and still count every one."""
    import itertools
    import re

    from graph.dashboard.pages import MAX_ROWS, tree_layout

    combos = itertools.product(*[range(k) for k in explores])
    branches = [{"id": i, "choices": {f"e{j}": f"v{c}" for j, c in enumerate(combo)},
                 "status": "chosen" if i == 37 else "dropped" if i % 3 else "pruned", "metrics": {"acc": i / n}}
                for i, combo in enumerate(combos)]
    layout = tree_layout(branches, "run")
    nodes = layout["nodes"]
    assert layout["rows"] <= MAX_ROWS and (layout["rows"] == n) == (n <= MAX_ROWS)
    for x in set(nodes["x"]):
        ys = sorted(y for y, xx in zip(nodes["y"], nodes["x"]) if xx == x)
        assert all(b - a >= 1.0 for a, b in zip(ys, ys[1:])), f"labels overlap in column {x}"
    leaves = [(label, status) for label, status, size in zip(nodes["label"], nodes["status"], nodes["size"]) if size == 14]
    assert len(leaves) == layout["rows"]
    counted = sum(int(m.group(1)) if (m := re.search(r": (\d+) branches \(", label)) else 1 for label, _ in leaves)
    assert counted == n  # every branch is in exactly one shown row
    assert sum(status == "chosen" for _, status in leaves) == 1  # the chosen branch's row shows it
