"""The GPU check's machinery, on a machine without a GPU: the dry run of
benchmarks/gpu_check.sh, the time boxes and budget of benchmarks/gpu_check.py, and the wheel
set of benchmarks/gpu_wheelset.py (docs/gpu-check.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_wheelset
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _blocks(stdout: str) -> dict[str, str]:
    """The dry run's output, by step: the text from '== name' to the next step."""
    out = {}
    for chunk in stdout.split("\n== ")[1:]:
        out[chunk.split(" ", 1)[0]] = chunk
    return out


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
@pytest.mark.timeout(200)
def test_dry_run_names_every_step_says_what_it_would_do_or_why_not_and_exits_0(tmp_path):
    out = tmp_path / "out"
    # timeout: a safety bound (a dry run that starts a step's work hangs past it and fails); that it
    # runs nothing is checked below by what it wrote: would-run/would-skip records, no measurements
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run", "--out", str(out)], cwd=ROOT,
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    blocks = _blocks(p.stdout)
    assert list(blocks) == [s.name for s in gpu_check.STEPS]
    for step in gpu_check.STEPS:
        text = blocks[step.name]
        assert f"(time box {step.box} s)" in text and "command: " in text
        if "cuda" in step.needs and not _has_cuda():
            assert "would skip: no CUDA device" in text, text
        else:
            assert "would run" in text or "would skip: " in text
    assert "pytest collects" in blocks["tests-1worker"] and "test_allreduce_cuda_tensors_stay_on_device" in blocks[
        "tests-2workers"]
    if not (ROOT / ".whl").is_dir():
        assert "run 'make gpu-wheels'" in p.stdout  # the install step says what to do
    else:
        assert "install: " in p.stdout and ("imports: dask" in p.stdout or "FAILED" in p.stdout)
    try:
        import cudf  # noqa: F401
    except ImportError:
        assert "cudf is not on the machine and cannot travel" in blocks["cudf"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == ["install"] + [s.name for s in gpu_check.STEPS]
    assert {r["status"] for r in records[1:]} <= {"would-run", "would-skip"}
    assert all(r["reason"] for r in records[1:] if r["status"] == "would-skip")
    summary = (out / "summary.txt").read_text()
    assert all(s.name in summary for s in gpu_check.STEPS)
    files = sorted(f.name for f in out.rglob("*") if f.is_file())
    assert files == ["log.txt", "nvidia-smi.txt", "results.jsonl", "summary.txt"]  # nothing measured, 4 of 8
    assert "== allreduce" in (out / "log.txt").read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent (gone) would reap it


@pytest.mark.timeout(60)
def test_a_step_past_its_time_box_is_killed_with_its_children_and_keeps_what_it_wrote(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = textwrap.dedent(f"""
        import json, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(work / "child.pid")!r}, "w").write(str(child.pid))
        json.dump({{"measured": [1, 2]}}, open({str(work / "part.json")!r}, "w"))
        print("first part written", flush=True)
        time.sleep(120)
    """)
    step = gpu_check.Step("slow", 3, "a step that overruns", (), lambda ctx: [sys.executable, "-c", script],
                          json_out="part.json")
    ctx = gpu_check.Context(py=sys.executable, out=tmp_path, work=work, deadline=time.time() + 60)
    # the step sleeps 120 s, past this test's 60 s timeout: run_step returns only if the box ended it
    rec = gpu_check.run_step(step, ctx, box=3)
    assert rec["status"] == "timeout" and rec["rc"] is None and "3 s time box" in rec["reason"]
    assert rec["result"] == {"measured": [1, 2]} and rec["partial"] is True
    assert "first part written" in rec["log_tail"]
    pid = int((work / "child.pid").read_text())
    try:
        wait_for(lambda: not _alive(pid), timeout=5, what=f"the step's child {pid} to exit")
    except TimeoutError:
        pytest.fail("the step's child process outlived its time box")


def test_steps_the_budget_leaves_no_time_for_are_skipped_and_unknown_steps_refused(tmp_path, capsys):
    rc = gpu_check.main(["--out", str(tmp_path / "o"), "--budget", "0", "--python", sys.executable])
    assert rc == 0
    records = [json.loads(line) for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "skipped" for r in records)
    by_step = {r["step"]: r for r in records}
    assert "budget spent" in by_step["versions"]["reason"] and "budget spent" in by_step["cudf"]["reason"]
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--out", str(tmp_path / "o2"), "--only", "versions,nope"])
    assert exc.value.code == 2
    assert "unknown step(s) ['nope']" in capsys.readouterr().err


def test_junit_counts_come_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_three.py").write_text(textwrap.dedent("""
        import pytest
        def test_ok(): pass
        def test_bad(): assert 1 == 2, "one is not two"
        def test_skip(): pytest.skip("no GPU")
    """))
    xml = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "test_three.py"), "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}"], cwd=tmp_path, capture_output=True, timeout=120)
    counts = gpu_check._junit(xml)
    assert (counts["tests"], counts["passed"], counts["failures"], counts["skipped"]) == (3, 1, 1, 1)
    line = gpu_check.summarize([{"step": "tests-1worker", "status": "ok", "seconds": 2, "box_s": 75,
                                 "result": counts}])
    assert "1 passed, 1 failed, 1 skipped" in line and "test_bad" in line


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal real wheel: a zip holding a dist-info METADATA."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def _avail(paths):
    return {n: (v, r) for n, v, r in map(gpu_wheelset.wheel_metadata, paths)}


def test_wheel_closure_evaluates_markers_for_the_devices_python_and_names_what_is_missing(tmp_path):
    alpha = _wheel(tmp_path, "alpha", "1.0", [
        "beta>=2", "importlib_metadata>=4; python_version < '3.12'",  # not on 3.12: not needed
        "numpy<3", "gamma; extra == 'docs'", "bokeh<3.10"])
    beta = _wheel(tmp_path, "beta", "2.1", [])
    ok = gpu_wheelset.closure(["alpha==1.0"], _avail([alpha, beta]))
    assert ok["carry"] == {"alpha": "1.0", "beta": "2.1"} and ok["problems"] == []
    assert ok["on_device"] == {"numpy": ["alpha 1.0: numpy<3"]} and "bokeh" in ok["left_out"]

    missing = gpu_wheelset.closure(["alpha==1.0"], _avail([alpha]))
    assert missing["problems"] == ["alpha 1.0 needs beta>=2: neither carried nor on the device"]
    old_beta = _wheel(tmp_path / "", "beta", "1.0", [])
    wrong = gpu_wheelset.closure(["alpha==1.0"], _avail([alpha, old_beta]))
    assert wrong["problems"] == ["alpha 1.0 needs beta>=2, the set has beta 1.0"]
    numpy_old = gpu_wheelset.closure(["numpy<2"], {})
    assert numpy_old["problems"] == [f"(root) needs numpy<2, the device has numpy {gpu_wheelset.DEVICE_VERSIONS['numpy']}"]


def test_two_versions_of_one_wheel_are_refused(tmp_path):
    _wheel(tmp_path, "zict", "3.0.0", [])
    _wheel(tmp_path, "zict", "2.2.0", [])
    report = gpu_wheelset.check_dir(tmp_path)
    assert not report["ok"]
    assert any(p.startswith("two wheels of zict") for p in report["problems"])


def test_roots_follow_the_pyproject_pins():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dask_pin = next(d for d in meta["optional-dependencies"]["gpu"] if d.startswith("dask=="))  # the gpu extra's pin
    roots = gpu_wheelset.roots()
    assert dask_pin in roots and "dask-cuda==26.10.*" in roots  # dask-cuda without its cu12 extra
    assert roots[-1] == gpu_wheelset.UCX_ROOT and gpu_wheelset.UCX_ROOT not in gpu_wheelset.roots(ucx=False)


@pytest.mark.skipif(not (ROOT / ".whl").is_dir(), reason="no .whl/ here (make gpu-wheels fetches it)")
def test_the_fetched_wheel_set_meets_every_requirement_and_fits():
    report = gpu_wheelset.check_dir(ROOT / ".whl")
    assert report["problems"] == []
    assert gpu_wheelset.tree_bytes() + report["wheel_bytes"] <= gpu_wheelset.LIMIT_BYTES
