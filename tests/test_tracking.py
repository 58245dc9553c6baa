"""Explorations logged to MLflow (pipelines/tracking.py, issue 48), against a real tracking server.

The module starts ``mlflow server`` (SQLite backend, artifacts in a temporary directory, on a
free loopback port) once and stops it at the end; the explorations run on conftest's shared
LocalCluster.  What the server holds is read back with MLflow's own client.  A tracker that goes
away mid-run is a real TCP relay in front of the server, closed while a branch still runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from tests.conftest import wait_for

mlflow = pytest.importorskip("mlflow")

from pipelines import Pipeline, RunError, grid, halving  # noqa: E402
from pipelines.tracking import MLflow, TrackingWarning  # noqa: E402
from tests import prune_steps as ps  # noqa: E402
from tests import tracking_steps as ts  # noqa: E402

pytestmark = pytest.mark.slow  # an MLflow server of its own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real ``mlflow server`` on a free loopback port; its URI."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    # no job runner: MLflow 3's server otherwise starts about eight huey consumers that poll all
    # the while (a few % of a core each); tracking uses none of its jobs
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(up, timeout=120, what="the mlflow server's /health", interval=0.25)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


def runs_of(uri: str, experiment: str) -> tuple:
    """``(parents, {parent id: children})`` of ``experiment``, oldest first."""
    c = mlflow.MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return [], {}
    runs = c.search_runs([exp.experiment_id], max_results=1000, order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children: dict = {}
    for r in runs:
        if "mlflow.parentRunId" in r.data.tags:
            children.setdefault(r.data.tags["mlflow.parentRunId"], []).append(r)
    for kids in children.values():
        kids.sort(key=lambda r: int(r.data.tags["branch"]))
    return parents, children


def artifacts(uri: str, run_id: str, path: str | None = None) -> set:
    return {a.path for a in mlflow.MlflowClient(uri).list_artifacts(run_id, path)}


def tracked(**options):
    """Run options and the warnings the run gave, every TrackingWarning among them."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield_ = options.pop("node").run(**options)
    return yield_, [w for w in seen if issubclass(w.category, TrackingWarning)]


def test_an_exploration_is_a_parent_run_and_each_branch_a_child(server, client, tmp_path):
    curves = [("best", (0.6, 0.7, 0.8, 0.9)), ("mid", (0.5, 0.55, 0.6, 0.62)), ("low", (0.1,) * 4),
              ("fail1", (0.3, 0.3, 0.3))]
    node = (Pipeline("curves").source(ps.data)
            .explore("c", grid(ps.curve, spec=curves, log_dir=[str(tmp_path)]))
            .choose("score", prune=halving(factor=3)))
    result, warned = tracked(node=node, client=client, progress=False, tracking=MLflow(server, experiment="curves"))
    assert warned == []
    table = result.table
    assert set(table["status"]) >= {"ok", "failed"} and table["chosen"].sum() == 1
    parents, children = runs_of(server, "curves")
    (parent,) = parents
    kids = children[parent.info.run_id]
    assert parent.info.run_name == "curves" and parent.info.status == "FINISHED"
    tags = parent.data.tags
    assert tags["quiver.version"] and tags["quiver.scheduler"] == client.scheduler.address
    assert tags["quiver.memory_budget"] == "None" and tags["quiver.restored"] == "false"
    assert "explores: c" in tags["mlflow.note.content"]
    assert parent.data.metrics["executed_tasks"] == result.stats["executed_tasks"]
    assert parent.data.metrics["branches"] == len(table)
    assert {"quiver.json", "report"} <= artifacts(server, parent.info.run_id)
    assert "report/report.html" in artifacts(server, parent.info.run_id, "report")
    c = mlflow.MlflowClient(server)
    assert [int(k.data.tags["branch"]) for k in kids] == list(range(len(table)))
    for j, kid in enumerate(kids):
        row = table.iloc[j]
        # params: the table's choice and parameter columns, by the same names
        assert kid.data.params["c"] == row["c"] and kid.data.params["c.spec"] == str(row["c.spec"])
        assert kid.data.tags["status"] == row["status"] and kid.data.tags["chosen"] == str(bool(row["chosen"])).lower()
        assert kid.data.metrics["seconds"] == pytest.approx(row["seconds"])
        # every report of the iterative step, at its iteration: MLflow's curve
        curve = [(m.step, m.value) for m in c.get_metric_history(kid.info.run_id, "score")]
        reports = [(i, h["score"]) for i, h in enumerate(result.history[j], start=1)]
        assert curve[:len(reports)] == reports and len(reports) == row["iterations"]
        if row["status"] == "failed":
            assert kid.info.status == "FAILED"
            assert kid.data.tags["error"] == "RuntimeError: fail1 fails at iteration 1"
            assert kid.data.tags["failed_step"] == row["failed_step"]
        else:
            assert kid.info.status == "FINISHED" and "error" not in kid.data.tags
    chosen = kids[int(table.index[table["chosen"]][0])]
    assert "value.pkl" in artifacts(server, chosen.info.run_id)  # a dict: pickled
    local = c.download_artifacts(chosen.info.run_id, "value.pkl", str(tmp_path))
    import pickle

    with open(local, "rb") as f:
        assert pickle.load(f) == result.value
    payload = json.loads(Path(c.download_artifacts(parent.info.run_id, "quiver.json", str(tmp_path))).read_text())
    assert len(payload["table"]) == len(table)


def test_a_rerun_from_the_store_logs_the_same_runs_under_a_new_parent_tagged_restored(server, client, tmp_path):
    node = (Pipeline("digits").source(ts.digits)
            .explore("model", grid(ts.logistic, C=[0.01, 1.0]))
            .choose("accuracy"))
    options = dict(node=node, client=client, progress=False, store=str(tmp_path / "store"),
                   tracking=MLflow(server, experiment="digits", tags={"team": "tests"}))
    first, _ = tracked(**dict(options))
    again, warned = tracked(**dict(options))
    assert warned == [] and again.stats["executed_tasks"] == 0
    parents, children = runs_of(server, "digits")
    assert [p.data.tags["quiver.restored"] for p in parents] == ["false", "true"]
    assert all(p.data.tags["team"] == "tests" for p in parents)
    logged = [[(k.data.params, k.data.tags["status"], k.data.tags["chosen"], k.data.metrics["accuracy"])
               for k in children[p.info.run_id]] for p in parents]
    assert logged[0] == logged[1] and len(logged[0]) == 2
    assert [k.data.params["model.C"] for k in children[parents[1].info.run_id]] == ["0.01", "1.0"]
    assert all(k.data.tags.get("quiver.restored") == "true" for k in children[parents[1].info.run_id])
    # the chosen value holds a scikit-learn model: an MLflow model, loadable with mlflow.sklearn
    j = int(again.table.index[again.table["chosen"]][0])
    kid = children[parents[1].info.run_id][j]
    assert {"model", "value.pkl"} <= artifacts(server, kid.info.run_id)
    model = mlflow.sklearn.load_model(mlflow.MlflowClient(server).download_artifacts(kid.info.run_id, "model", str(tmp_path)))
    X, y = ts.digits()
    assert model.score(X, y) == pytest.approx(again.value["accuracy"])


class Relay:
    """A TCP relay to the tracking server (real sockets): ``close()`` ends it and every connection
    through it, so the tracker behind it is gone, as a server that stopped."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            if self.closed:  # accepted as it closed
                down.close()
                return
            up = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it (close alone does not)
        except OSError:
            pass
        self.listener.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_a_tracker_that_stops_mid_run_leaves_the_result_whole_with_one_warning(server, client):
    """Branches are logged as they finish: the fast ones are on the server while the slow one still
    runs; then the tracker goes away; the run ends as it would have, with one TrackingWarning."""
    relay = Relay(int(server.rsplit(":", 1)[1]))
    node = (Pipeline("stopped").source(ts.numbers)
            .explore("wait", grid(ts.wait, seconds=[0.0, 0.05, 6.0]))
            .choose("score", mode="min"))
    seen: list = []

    def stop_once_two_are_logged(stop: threading.Event) -> None:
        while not stop.is_set():
            _, children = runs_of(server, "stopped")
            done = [k for kids in children.values() for k in kids if k.info.status == "FINISHED"]
            if len(done) >= 2:
                seen.extend(done)
                relay.close()
                return
            time.sleep(0.1)

    stop = threading.Event()
    watcher = threading.Thread(target=stop_once_two_are_logged, args=(stop,), daemon=True)
    watcher.start()
    try:
        result, warned = tracked(node=node, client=client, progress=False,
                                 tracking=MLflow(f"http://127.0.0.1:{relay.port}", experiment="stopped", timeout=3))
    finally:
        stop.set()
        watcher.join(10)
        relay.close()
    assert len(seen) == 2, "the two fast branches were not on the server while the slow one ran"
    assert len(warned) == 1 and "went on without it" in str(warned[0].message)
    assert list(result.table["status"]) == ["ok", "ok", "ok"] and result.value["score"] == 0.0
    parents, children = runs_of(server, "stopped")
    (parent,) = parents
    assert parent.info.status == "RUNNING"  # nobody could end it: what was logged before stays
    assert sorted(k.data.params["wait.seconds"] for k in children[parent.info.run_id]) == ["0.0", "0.05"]


def test_a_tracker_that_is_not_there_costs_one_warning(client):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    node = Pipeline("dead").source(ts.numbers).explore("wait", grid(ts.wait, seconds=[0.0, 0.01])).choose("score")
    result, warned = tracked(node=node, client=client, progress=False, tracking=f"http://127.0.0.1:{dead}")
    assert len(warned) == 1 and f"127.0.0.1:{dead}" in str(warned[0].message)
    assert list(result.table["status"]) == ["ok", "ok"] and result.value["score"] == 0.01


_INTERRUPTED = r"""
import signal, sys, time
from distributed import Client, LocalCluster
from pipelines import Pipeline, grid
from pipelines.tracking import MLflow
from tests import tracking_steps as ts

SEEN = []  # the statuses the listener saw, as they changed: printed if no interrupt came

def interrupt_after_the_first(driver):  # Ctrl-C, while the slow branch runs
    def listener(state):
        now = (state.status(0), state.status(1))
        if not SEEN or SEEN[-1][1] != now:
            SEEN.append((round(time.monotonic() - T0, 2), now))
        if now[0] in ("done", "ok") and now[1] == "running":
            driver.listeners.remove(listener)
            signal.raise_signal(signal.SIGINT)
    driver.listeners.append(listener)

if __name__ == "__main__":
    # Ctrl-C as in a terminal: a process started in the background by a shell (as CI starts its
    # run) inherits SIGINT ignored, and then Python installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    node = Pipeline("interrupted").source(ts.numbers).explore("wait", grid(ts.wait, seconds=[0.0, 30.0])).choose("score")
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cl, \
            Client(cl) as client:
        T0 = time.monotonic()
        try:
            r = node.run(client, progress=False, tracking=MLflow(sys.argv[1], experiment="interrupted", timeout=60),
                         on_driver=interrupt_after_the_first)
        except KeyboardInterrupt:
            print("RESULT KeyboardInterrupt")
        else:
            print("RESULT no interrupt; the listener saw", SEEN)
            print(r.table.to_string())
"""


def test_a_stopped_run_ends_failed_or_killed_with_its_unfinished_branches(server, client, tmp_path):
    # Ctrl-C as a user's script gets it: in a process of its own, on its main thread, with Python's
    # own SIGINT handler (CI starts its run in the background, where SIGINT is inherited ignored)
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(script), server], cwd=root, capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(root)})
    said = out.stdout[-2000:] + out.stderr[-3000:]
    assert "RESULT KeyboardInterrupt" in out.stdout, said
    parents, children = runs_of(server, "interrupted")
    assert len(parents) == 1, said
    (parent,) = parents
    assert parent.info.status == "KILLED" and parent.data.tags["error"] == "KeyboardInterrupt", said
    kids = children[parent.info.run_id]
    assert [k.info.status for k in kids] == ["FINISHED", "KILLED"]
    assert kids[1].data.tags["status"] == "cancelled"

    failing = (Pipeline("all-fail").source(ts.numbers)
               .explore("wait", grid(ts.wait, seconds=["x", "y"]))  # time.sleep("x"): every branch fails
               .choose("score"))
    with pytest.raises(RunError):
        failing.run(client, progress=False, tracking=MLflow(server, experiment="all-fail"))
    (parent,), children = runs_of(server, "all-fail")
    assert parent.info.status == "FAILED" and parent.data.tags["error"].startswith("RunError: every branch failed")
    assert [k.data.tags["status"] for k in children[parent.info.run_id]] == ["failed", "failed"]
    assert all(k.data.tags["error"].startswith("TypeError") for k in children[parent.info.run_id])


def test_the_dropin_search_logs_a_child_per_candidate(server, client):
    from sklearn.linear_model import LogisticRegression

    from pipelines.sklearn import GridSearchCV

    X, y = ts.digits()
    search = GridSearchCV(LogisticRegression(max_iter=100), {"C": [0.01, 0.1, 1.0]}, cv=2, client=client,
                          progress=False, tracking=MLflow(server, experiment="dropin")).fit(X, y)
    (parent,), children = runs_of(server, "dropin")
    kids = children[parent.info.run_id]
    assert len(kids) == len(search.cv_results_["params"]) == 3
    assert parent.info.run_name == "GridSearchCV" and parent.info.status == "FINISHED"
    assert sorted(k.data.metrics["mean_test_score"] for k in kids) == sorted(search.cv_results_["mean_test_score"])


def test_bad_tracking_is_refused_before_a_cluster_starts():
    from pipelines import PipelineError

    node = Pipeline("bad").source(ts.numbers)
    with pytest.raises(PipelineError, match="expected an MLflow tracking URI"):
        node.run(tracking=42)
    with pytest.raises(PipelineError, match="timeout"):
        node.run(tracking=MLflow("http://127.0.0.1:1", timeout=0))


def test_import_pipelines_does_not_import_mlflow():
    from tests.fresh_python import python_prints

    code = ("import sys, pipelines, pipelines.tracking, pipelines.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))")
    assert python_prints(code) == "[]"


def test_the_cli_logs_with_mlflow_uri(server, client, tmp_path, capsys):
    from pipelines.cli import main

    file = tmp_path / "waits.py"
    file.write_text(
        "from pipelines import Pipeline, grid\n"
        "from tests import tracking_steps as ts\n"
        "output = Pipeline('cli').source(ts.numbers).explore('wait', grid(ts.wait, seconds=[0.0, 0.01])).choose('score')\n"
    )
    assert main(["run", str(file), "--scheduler", client.scheduler.address, "--no-progress",
                 "--mlflow-uri", server, "--mlflow-experiment", "cli"]) == 0
    (parent,), children = runs_of(server, "cli")
    assert parent.info.run_name == "cli" and parent.info.status == "FINISHED"
    assert [k.data.params["wait.seconds"] for k in children[parent.info.run_id]] == ["0.0", "0.01"]
    with pytest.raises(SystemExit) as bad:  # a bad URI: exit 2, before the file is loaded
        main(["run", str(file), "--mlflow-uri", " "])
    assert bad.value.code == 2 and "tracking URI" in capsys.readouterr().err
