"""The ``quiver`` command, run as a user would: a real process, a real embedded cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "digits_explore.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # slow: quiver run in subprocesses, each with an embedded cluster


def quiver(*args, cwd=ROOT, timeout=200):
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_help_documents_every_option():
    out = quiver("run", "--help")
    assert out.returncode == 0
    for flag in ["--scheduler", "--workers", "--threads-per-worker", "--memory-limit", "--no-progress", "--node", "--json",
                 "--stall-timeout"]:
        assert flag in out.stdout
    top = quiver("--help")
    assert top.returncode == 0 and "run" in top.stdout


def test_runs_the_example_end_to_end(tmp_path):
    report = tmp_path / "result.json"
    out = quiver("run", str(EXAMPLE), "--workers", "2", "--no-progress", "--json", str(report))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "chosen branch(es):" in out.stdout
    assert "embedded LocalCluster (2 workers)" in out.stderr
    data = json.loads(report.read_text())
    rows = data["table"]
    assert len(rows) == 63
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["status"] == "ok"
    assert chosen[0]["accuracy"] == max(r["accuracy"] for r in rows)
    assert 0.0 < chosen[0]["test_accuracy"] <= 1.0
    assert data["stats"]["executed_tasks"] == 1 + 3 + 9 + 63 + 1


def test_missing_file_is_a_one_line_error(tmp_path):
    out = quiver("run", str(tmp_path / "nope.py"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"quiver: error: no such file: {tmp_path / 'nope.py'}"]


def test_file_without_the_node_names_what_it_has(tmp_path):
    f = tmp_path / "pipe.py"
    f.write_text("from pipelines import Pipeline\nmine = Pipeline('p').source(lambda: 1)\n")
    out = quiver("run", str(f))
    assert out.returncode == 1
    assert "defines no pipeline node named 'output'" in out.stderr and "mine" in out.stderr


def test_file_that_raises_while_loading(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('broken on purpose')\n")
    out = quiver("run", str(f))
    assert out.returncode == 1
    assert "failed to load: RuntimeError: broken on purpose" in out.stderr


def test_definition_error_in_the_file(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(
        "from pipelines import Pipeline\n"
        "output = Pipeline('p').source(lambda: 1).choose('x')\n"
    )
    out = quiver("run", str(f))
    assert out.returncode == 1
    assert "nothing is explored upstream" in out.stderr


def test_bad_arguments_exit_2():
    out = quiver("run", str(EXAMPLE), "--workers", "zero")
    assert out.returncode == 2 and "not a whole number" in out.stderr
    out = quiver("run", str(EXAMPLE), "--memory-limit", "lots")
    assert out.returncode == 2 and "not a size" in out.stderr
    out = quiver("run", str(EXAMPLE), "--stall-timeout", "-5")
    assert out.returncode == 2 and "must be a number of seconds >= 0" in out.stderr


def test_node_option_and_every_branch_failing(tmp_path):
    f = tmp_path / "failing.py"
    f.write_text(
        "from pipelines import Pipeline, grid\n"
        "def boom(v, n):\n    raise ValueError(f'no {n}')\n"
        "alt = Pipeline('p').source(lambda: 1).explore('e', grid(boom, n=[1, 2]))\n"
    )
    out = quiver("run", str(f), "--node", "alt", "--workers", "1", "--no-progress")
    assert out.returncode == 1
    assert "every branch failed (2 of 2)" in out.stderr and "ValueError" in out.stderr


NOISY = '''
from pipelines import Pipeline, grid


def noisy(seed, k):
    import logging

    for i in range(6):
        logging.getLogger("distributed.worker").warning("a noisy Dask-style warning (%d)", i)
    return {"acc": k / 10}


output = Pipeline("noisy").source(lambda seed: seed, seed=0).explore("m", grid(noisy, k=[1, 2])).choose("acc")
'''


def test_dasks_warnings_are_shown_once_each_and_all_of_them_with_verbose(tmp_path):
    """Issue 44 item 5: a Dask warning repeated 12 times is shown once with a count; --verbose
    shows Dask's log as Dask prints it."""
    f = tmp_path / "noisy.py"
    f.write_text(NOISY)
    quiet = quiver("run", str(f), "--workers", "1", "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    import re

    # once per process that logged it (a worker; the bridge in the CLI's own process, if a branch ran there)
    firsts = quiet.stderr.count("a noisy Dask-style warning (0)")
    summaries = [int(n) for n in re.findall(r"Dask-style warning \(%d\)' \d+ more time\(s\) \((\d+) in all", quiet.stderr)]
    assert firsts == len(summaries) >= 1 and sum(summaries) == 12, quiet.stderr[-3000:]
    assert "a noisy Dask-style warning (1)" not in quiet.stderr
    loud = quiver("run", str(f), "--workers", "1", "--no-progress", "--verbose", cwd=tmp_path)
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert all(f"a noisy Dask-style warning ({i})" in loud.stderr for i in range(6))
    assert "more time(s)" not in loud.stderr
