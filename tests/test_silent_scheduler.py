"""A scheduler that stops answering mid-run: the run ends with one clear line, in bounded time.

The scheduler and its worker are real processes of their own (``dask scheduler`` and
``dask worker``), so the test can SIGSTOP the scheduler while the client, the run's driver
and its watchdog go on (docs/architecture.md §4, "Bounded waits")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import graph
from graph.errors import RunError
from graph.run.executor import execute
from pipelines import Pipeline, grid
from tests import steps
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
DASK = str(Path(sys.executable).with_name("dask"))


def _wait_for(path: Path, seconds: float) -> dict:
    def written() -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    return wait_for(written, timeout=seconds, what=f"a scheduler file at {path}", interval=0.1)


@pytest.fixture
def separate_scheduler(tmp_path):
    """``(address, scheduler process)``: a scheduler and one single-thread worker, each a process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sched_file = tmp_path / "scheduler.json"
    common = dict(cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sched = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                              "--scheduler-file", str(sched_file), "--no-show"], **common)
    procs = [sched]
    try:
        address = _wait_for(sched_file, 60)["address"]
        procs.append(subprocess.Popen([DASK, "worker", address, "--nthreads", "1", "--no-nanny",
                                       "--no-dashboard", "--memory-limit", "0"], **common))
        yield address, sched
    finally:
        for p in procs:  # a stopped process is continued, so it can die
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait(timeout=30)


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_scheduler_that_stops_answering_ends_the_run_with_one_line(separate_scheduler):
    from distributed import Client

    address, sched = separate_scheduler
    stall = 5.0  # the scheduler answers within it on a loaded machine, before it is stopped
    node = Pipeline("silent").source(steps.source).explore("a", grid(steps.sleep_then, seconds=[0.5 + i / 100 for i in range(12)])).choose("x")
    stopped = threading.Event()

    def stop_the_scheduler_mid_run(driver):
        def watch():
            while driver.state.progress()["tasks_done"] < 3:  # a few results are in: mid-run
                time.sleep(0.05)
            os.kill(sched.pid, signal.SIGSTOP)
            stopped.set()

        t = threading.Thread(target=watch, daemon=True)
        t.start()

    client = Client(address, timeout=30)
    client.wait_for_workers(1, timeout=60)
    try:
        with pytest.raises(RunError) as info:
            execute(graph.compile(node), client, progress=False, stall_timeout=stall, on_driver=stop_the_scheduler_mid_run)
        assert stopped.is_set(), f"the run ended before the scheduler was stopped: {info.value}"
        msg = str(info.value)
        # ended by the watchdog's silent-scheduler rule (the module's 180 s timeout turns a hang into
        # a failure), once the silence reached stall_timeout, not before
        assert "has not answered for" in msg and address in msg and "stall_timeout" in msg
        assert "\n" not in msg
        silent = re.search(r"has not answered for (\d+) s", msg)
        assert silent and int(silent.group(1)) >= stall, msg
        assert set(info.value.table["status"]) <= {"cancelled", "dropped", "ok"}
    finally:
        os.kill(sched.pid, signal.SIGCONT)
        client.close(timeout=10)
