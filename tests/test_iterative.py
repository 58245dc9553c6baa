"""Iterative steps on a real LocalCluster with worker processes (graph.tasks.iterative).

Every ordering here is proven by evidence the steps leave (files, start order), never by
timing: a step that waits for a file only the test writes after it saw a report proves the
report arrived while the step ran; a task that starts on the same one-thread worker and
finds the stopped generator's ``finally`` file proves the worker was freed by the stop.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path

import pytest

from graph.tasks.iterative import Iterative, ReportChannel
from graph.state.halving import Halving, Pruned, Stop
from graph.spec import PruneSpec
from graph.parcels import opened
from tests.conftest import wait_for as wait_until  # this module's wait_for is a step's gate

pytestmark = pytest.mark.slow  # training-style runs with pruning

WAIT = 120  # seconds before a test gives up waiting for an event (a hang, not a timing check)


# ---- steps (run on the workers) ----------------------------------------------------------------
def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def counting(n: int, hold_at: int, gate: str):
    """Reports 1..n; after report ``hold_at`` it waits until the test writes ``gate``."""
    for i in range(1, n + 1):
        yield {"i": i, "score": float(i)}
        if i == hold_at:
            wait_for(gate)
    return {"done": n}


def endless(name: str, log_dir: str, curve: tuple = ()):
    """Reports forever (a score from ``curve``, then 0); its ``finally`` leaves a file."""
    i = 0
    try:
        while True:
            i += 1
            yield {"score": curve[i - 1] if i <= len(curve) else 0.0}
            time.sleep(0.005)
    finally:
        Path(log_dir, f"{name}.closed").write_text(str(i))


def starts(name: str, log_dir: str, closed: str) -> dict:
    """A plain task: records that it started and whether ``closed`` existed by then."""
    seen = os.path.exists(Path(log_dir, closed))
    Path(log_dir, f"{name}.started").write_text(str(seen))
    return {"saw_closed": seen}


def restartable(log_dir: str, n: int):
    """Reports 1..n; its first attempt hangs after report 3 (the test kills its worker)."""
    attempt = len(list(Path(log_dir).glob("attempt-*"))) + 1
    Path(log_dir, f"attempt-{attempt}").write_text(str(os.getpid()))
    for i in range(1, n + 1):
        yield {"score": 1.0 / i}
        if i == 3 and attempt == 1:
            wait_for(os.path.join(log_dir, "never"))
    return {"score": 1.0 / n, "attempt": attempt}


# ---- helpers ---------------------------------------------------------------------------------------
class Driver:
    """What the run's state machine does with reports, reduced to the test's needs."""

    def __init__(self, client, prune: PruneSpec | None = None, branches: dict | None = None):
        self.events: queue.Queue = queue.Queue()
        self.log: list[tuple] = []
        self.halving = Halving(prune) if prune else None
        self.branches = branches or {}
        self.channel = ReportChannel(client, lambda key, i, report: self.events.put((key, i, report)))

    def next(self, timeout: float = WAIT) -> tuple:
        key, i, report = self.events.get(timeout=timeout)
        self.log.append((key, i, report))
        if self.halving is not None and self.halving.prune.rung_of(i) is not None:
            decision = self.halving.report(self.branches.get(key, 0), None, i, report["score"])
            assert self.channel.waiting[key] == i
            if isinstance(decision, Stop) and decision.pruned:
                self.channel.stop(key)  # the rung it waits at
            else:
                self.channel.resume(key, i)
        return key, i, report

    def until(self, key: str, iteration: int) -> None:
        while (key, iteration) not in [(k, i) for k, i, _ in self.log]:
            self.next()


def worker_addresses(client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


# ---- tests -------------------------------------------------------------------------------------------
def test_reports_arrive_in_order_while_the_step_runs(client, log_dir):
    gate = os.path.join(log_dir, "gate")
    driver = Driver(client)
    try:
        fut = client.submit(Iterative(counting), 5, 3, gate, key="counting-1", pure=False)
        driver.until("counting-1", 3)  # the step cannot finish before the test writes the gate
        assert not fut.done()
        Path(gate).write_text("go")
        assert opened(fut.result(timeout=WAIT)) == {"done": 5}
        driver.until("counting-1", 5)
    finally:
        driver.channel.close()
    assert [(k, i, r["i"]) for k, i, r in driver.log] == [("counting-1", i, i) for i in range(1, 6)]
    assert driver.channel.replayed == 0


def test_a_stop_at_a_rung_closes_the_generator_and_frees_its_worker(client, log_dir):
    w = worker_addresses(client)[0]
    prune = PruneSpec(factor=2, min_iter=1)  # rungs at 1, 2, 4, 8, ...
    # branch 0 scores 1.0 at rung 1; branch 1 arrives second with 0.5: top max(1, 2 // 2) = 1 -> pruned
    driver = Driver(client, prune, {"best": 0, "loser": 1})
    try:
        best = client.submit(Iterative(endless, prune), "best", log_dir, (1.0, 1.0), key="best", workers=[w], pure=False)
        driver.until("best", 1)
        # queued behind best on the same one-thread worker, loser first (explicit priorities)
        loser = client.submit(Iterative(endless, prune), "loser", log_dir, (0.5,), key="loser", workers=[w],
                              pure=False, priority=1)
        after = client.submit(starts, "after", log_dir, "loser.closed", key="after", workers=[w], pure=False)
        assert driver.halving.stopped(0) is None
        driver.until("best", 2)  # best waits at rung 2 for its answer; resumed by the driver
        # best is endless: stop it by cancelling its task (the run's other way to stop a step)
        best.cancel()
        driver.until("loser", 1)  # rung 1, second there, worse: the driver stops it
        result = opened(loser.result(timeout=WAIT))
        assert opened(after.result(timeout=WAIT)) == {"saw_closed": True}
    finally:
        driver.channel.close()
    assert result == Pruned(1, {"score": 0.5})
    assert Path(log_dir, "loser.closed").read_text() == "1"  # closed at its first report
    assert Path(log_dir, "best.closed").exists()  # the cancelled one was closed too
    assert driver.halving.stopped(1) == Stop(0, 1)
    assert [(k, i) for k, i, _ in driver.log if k == "loser"] == [("loser", 1)]


def test_max_iter_closes_the_generator_and_returns_the_last_report(client, log_dir):
    prune = PruneSpec(factor=2, min_iter=1, max_iter=3)
    driver = Driver(client, prune)
    try:
        fut = client.submit(Iterative(endless, prune), "capped", log_dir, (3.0, 2.0, 1.0), key="capped", pure=False)
        driver.until("capped", 3)  # answers rungs 1 and 2 (the step waits there)
        assert opened(fut.result(timeout=WAIT)) == {"score": 1.0}
    finally:
        driver.channel.close()
    assert Path(log_dir, "capped.closed").read_text() == "3"
    assert [i for _, i, _ in driver.log] == [1, 2, 3]


def test_a_step_restarted_after_its_worker_was_killed_replays_without_double_counting(log_dir):
    from distributed import Client, LocalCluster

    prune = PruneSpec(factor=2, min_iter=1)  # rungs 1, 2, 4
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        driver = Driver(c, prune, {"restartable-1": 0})
        try:
            fut = c.submit(Iterative(restartable, prune), log_dir, 5, key="restartable-1", pure=False)
            driver.until("restartable-1", 3)  # the first attempt now hangs after report 3
            pid = int(Path(log_dir, "attempt-1").read_text())
            assert pid in c.run(os.getpid).values()  # a worker process this test's cluster started
            os.kill(pid, signal.SIGKILL)
            driver.until("restartable-1", 5)  # the driver answers rung 4 (rungs 1, 2: answered before)
            assert opened(fut.result(timeout=WAIT)) == {"score": 0.2, "attempt": 2}
        finally:
            driver.channel.close()
    assert [i for _, i, _ in driver.log] == [1, 2, 3, 4, 5]  # each iteration delivered once
    assert driver.channel.replayed == 3 and len(driver.channel.attempts["restartable-1"]) == 2
    # rung 1 and 2 counted once (n stays 1), rung 4 reached by the second attempt only
    assert {r: [e.n for e in es] for (_, r), es in driver.halving.arrivals.items()} == {0: [1], 1: [1], 2: [1]}


def scripted(name: str, log_dir: str, level: float):
    """A branch whose metric is ``level`` plus a little per iteration; records start and close."""
    journal = os.path.join(log_dir, "journal")
    with open(journal, "a") as f:
        f.write(f"start {name}\n")
    i = 0
    try:
        while True:
            i += 1
            yield {"score": level + i / 1000}
    finally:
        with open(journal, "a") as f:
            f.write(f"closed {name} {i}\n")


def test_branches_are_pruned_at_the_rungs_the_rule_says_and_free_their_workers(client, log_dir):
    from tests.test_pruning import literal

    prune = PruneSpec(factor=3, min_iter=1, max_iter=9)  # rungs at 1 and 3; 9 reports: finished
    levels = [0.5, 0.9, 0.2, 0.7, 0.4, 0.8, 0.1, 0.6]
    keys = [f"scripted-{b}" for b in range(len(levels))]
    driver = Driver(client, prune, {k: b for b, k in enumerate(keys)})
    try:
        futures = [
            client.submit(Iterative(scripted, prune), k, log_dir, lv, key=k, pure=False, priority=-b)
            for b, (k, lv) in enumerate(zip(keys, levels))
        ]
        while not all(f.done() for f in futures) or not driver.events.empty():
            try:
                driver.next(timeout=0.2)  # a poll, so the loop sees the futures finish
            except queue.Empty:
                pass
        results = [opened(r) for r in client.gather(futures)]  # a step's value travels as a parcel
    finally:
        driver.channel.close()
    # decisions: the rule, replayed literally on the rung reports in the order they arrived
    rung_reports = [(driver.branches[k], None, i, r["score"]) for k, i, r in driver.log if prune.rung_of(i) is not None]
    expected = literal(prune, "max", rung_reports)
    assert [driver.halving.report(*r) for r in rung_reports] == expected
    stops = {b: a for (b, *_), a in zip(rung_reports, expected) if isinstance(a, Stop)}
    journal = Path(log_dir, "journal").read_text().split("\n")[:-1]
    closed = {line.split()[1]: int(line.split()[2]) for line in journal if line.startswith("closed")}
    for b, (k, res) in enumerate(zip(keys, results)):
        made = max(i for kk, i, _ in driver.log if kk == k)
        if b in stops:  # pruned at its rung: made exactly that many reports, generator closed there
            assert res == Pruned(stops[b].iteration, {"score": levels[b] + stops[b].iteration / 1000})
            assert made == closed[k] == stops[b].iteration
        else:  # ran to max_iter: its last report is its value
            assert res == {"score": levels[b] + 9 / 1000} and made == closed[k] == 9
    assert stops, "the scripted levels prune some branches"
    # two one-thread workers: every start after the first two needs a slot a close freed
    started = done = 0
    for line in journal:
        if line.startswith("start"):
            assert started < 2 + done, journal
            started += 1
        else:
            done += 1


# ---- the wrapper alone (no cluster: no reports, rungs pass) --------------------------------------------
def yields_a_number():
    yield 3


def fails_at_two(log_dir: str):
    try:
        yield {"score": 1.0}
        raise RuntimeError("diverged at iteration 2")
    finally:
        Path(log_dir, "failed.closed").write_text("yes")


def returns_none():
    yield {"score": 1.0}
    yield {"score": 2.0}


def test_the_wrapper_refuses_non_mapping_reports_and_lets_failures_through(log_dir):
    with pytest.raises(TypeError, match=r"yields_a_number yielded int at iteration 1; an iterative step yields one mapping"):
        Iterative(yields_a_number)()
    with pytest.raises(RuntimeError, match="diverged at iteration 2"):
        Iterative(fails_at_two, PruneSpec(2, 1))(log_dir)
    assert Path(log_dir, "failed.closed").read_text() == "yes"
    assert Iterative(returns_none)() == {"score": 2.0}  # no return value: the last report
    assert Iterative(returns_none, PruneSpec(2, 1, max_iter=1))() == {"score": 1.0}  # capped
    assert Iterative(len)([1, 2]) == 2  # not a generator: returned as is


@pytest.mark.slow
def test_the_transport_benchmark_runs_and_records_every_transport(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "transport.json"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "report_transport.py"), "--quick", "--output", str(out)],
        cwd=root, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data["reports"]) == {"log_event", "queue"}
    assert set(data["rung_answers"]) == {"event_variable (shipped)", "variable_poll", "queue_both_ways"}
    assert data["reports"]["log_event"]["latency"]["n"] == data["args"]["reports"]  # every report arrived


def test_a_step_whose_answer_was_deleted_before_it_read_it_frees_its_thread(log_dir):
    """The run's channel deletes its answers when the run ends (``ReportChannel.close``), which
    can come right after the last "stop" of a run (the run ends when the last branch is pruned):
    a step that saw the answer's event but had not yet read its variable must not block its
    worker thread forever. Reproduced exactly: the event is set, the variable is gone."""
    from distributed import Client, Event, LocalCluster

    from graph.tasks.iterative import gate_name

    prune = PruneSpec(factor=3, min_iter=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        Event(gate_name("gone-1", 1), client=c).set()  # answered, then the variable deleted
        driver = Driver(c)  # reports only: nothing answers
        try:
            fut = c.submit(Iterative(endless, prune), "gone", log_dir, key="gone-1", pure=False)
            driver.until("gone-1", 1)  # it waits at rung 1
            fut.cancel()  # the run ended: its futures are released
            after = c.submit(starts, "after", log_dir, "gone.closed", key="after", pure=False)
            assert opened(after.result(timeout=WAIT)) == {"saw_closed": True}  # the one thread was freed
        finally:
            driver.channel.close()
    assert Path(log_dir, "gone.closed").read_text() == "1"


def test_one_channel_per_client_and_a_closed_one_is_not_kept_by_the_client(client):
    """A client has one handler per event topic: a second run's channel on the same client
    would silently take the first run's reports (its steps then wait at rungs for ever), so it
    is refused with a message. And ``Client.unsubscribe_topic`` keeps the handler it was given:
    a closed channel must not stay reachable through it (it would pin the ended run's driver
    and state until the next run)."""
    import gc
    import weakref

    first = ReportChannel(client, lambda key, i, report: None)
    try:
        with pytest.raises(RuntimeError, match="one run at a time"):
            ReportChannel(client, lambda key, i, report: None)
    finally:
        first.close()
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None
    ReportChannel(client, lambda key, i, report: None).close()  # the next run's channel is welcome


def test_a_step_waiting_at_a_rung_no_run_answered_is_heard_by_the_next_run(client, log_dir):
    """A run can end before it answers a rung (its loop ended, or it aborted) and Dask may hand
    that still-executing step to the next run that submits its key: the step re-sends its rung
    report while it waits, so the next run's channel hears it and can answer (else it waits for
    ever). The run that already heard it does not count the re-send as a replay."""
    prune = PruneSpec(factor=2, min_iter=1)
    first = Driver(client)  # hears, never answers, ends
    try:
        fut = client.submit(Iterative(endless, prune), "unanswered", log_dir, (1.0, 1.0), key="unanswered-1", pure=False)
        first.until("unanswered-1", 1)
        heard = []  # the re-sends of the rung report this channel received, counted as they come
        on_event = first.channel._on_event

        def counting(event):
            if event[1].get("key") == "unanswered-1" and event[1].get("resend"):
                heard.append(event[1]["iteration"])
            on_event(event)

        first.channel._on_event = counting
        # the step re-sends while it waits (every GATE_POLL_S): two heard, neither a replay for this channel
        wait_until(lambda: len(heard) >= 2, timeout=30, what="two re-sends of the unanswered rung report")
        assert heard[:2] == [1, 1] and first.channel.replayed == 0
    finally:
        first.channel.close()
    second = Driver(client, prune, {"unanswered-1": 0})  # answers every rung it hears
    try:
        key, i, _ = second.next(timeout=30)
        assert (key, i) == ("unanswered-1", 1)
        second.until("unanswered-1", 2)  # it went on: the re-sent rung was answered
        fut.cancel()
    finally:
        second.channel.close()
