"""Run the GPU check's steps in order, each in its own time box, recording each as it ends.

Called by ``benchmarks/gpu_check.sh`` (which installs the carried wheels first and passes on
how that went); see docs/gpu-check.md. Every step is a separate process group: one that
overruns its box is killed with its Dask workers, recorded as ``timeout`` (with whatever
JSON it had written), and the next step starts. After each step, one JSON line goes to
``OUT/results.jsonl`` and ``OUT/summary.txt`` is rewritten, so a later failure, or the run
call's own limit, never loses an earlier result.

Files in OUT (the device returns at most 8): ``log.txt`` and ``nvidia-smi.txt`` (from the
shell script), ``results.jsonl``, ``summary.txt``, ``pytest-1worker.xml``, ``pytest-2workers.xml``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

__all__ = ["Step", "STEPS", "gpu_test_files", "preflight", "run_step", "summarize", "main"]

GPU_ONLY = ("cuda", "cupy", "dask_cuda")  # needs the CPU smoke mode (--cpu) does without
MIN_BOX = 10  # seconds: a step the budget leaves less than this is skipped, not started
TEST_TIMEOUT = 50  # seconds per gpu test (a cluster's start, a gang, a packed run: ~10-20 s each)
OUT_FILE_LIMIT = 8  # files the device brings back from $OUT


@dataclass
class Context:
    """Where a run stands: the Python the steps use, OUT, the work folder for the steps' JSON,
    the budget's deadline (epoch seconds), and the mode."""

    py: str
    out: Path
    work: Path
    deadline: float
    dry_run: bool = False
    device: str = "cuda"  # "cpu": the smoke mode (--cpu), the same steps on CPU workers, small sizes

    def pick(self, gpu: list[str], cpu: list[str]) -> list[str]:
        """A step's arguments on the GPU, or in the CPU smoke mode."""
        return cpu if self.device == "cpu" else gpu


@dataclass(frozen=True)
class Step:
    """One step: its name, time box (seconds), what it measures, what it needs on the machine
    (``cuda``, or modules that must be importable), its command, extra environment, and the
    file it leaves (a JSON in the work folder, or a junit XML in OUT)."""

    name: str
    box: int
    what: str
    needs: tuple[str, ...]
    command: Callable[[Context], list[str]]
    env: dict = field(default_factory=dict)
    json_out: str | None = None
    junit_out: str | None = None


def gpu_test_files(fixture: str | None = None) -> list[str]:
    """Test files with ``gpu``-marked tests (only those using ``fixture``, if given), so pytest
    never imports the modules that need packages the GPU machine lacks (selenium, optuna ...)."""
    files = []
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        text = f.read_text()
        if "pytest.mark.gpu" in text and (fixture is None or fixture in text):
            files.append(str(f.relative_to(ROOT)))
    return files


def _pytest(junit: str, fixture: str | None = None) -> Callable[[Context], list[str]]:
    def cmd(ctx: Context) -> list[str]:
        # -v: each test's outcome reaches log.txt as it ends (the junit XML is written only at
        # the end); --timeout: a hung test (a transport) fails alone instead of eating the box
        return [ctx.py, "-m", "pytest", *gpu_test_files(fixture), "-m", "gpu", "-v", "-rs", f"--timeout={TEST_TIMEOUT}",
                "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={ctx.out / junit}"]
    return cmd


def _steps_py(step: str, gpu: tuple[str, ...] = (), cpu: tuple[str, ...] = ()) -> Callable[[Context], list[str]]:
    return lambda ctx: [ctx.py, str(HERE / "gpu_steps.py"), step, "--out", str(ctx.work / f"{step}.json"),
                        *ctx.pick(list(gpu), list(cpu))]


STEPS: list[Step] = [
    Step("versions", 40, "Python, package versions and paths, torch's view of the GPU, the driver",
         (), _steps_py("versions"), json_out="versions.json"),
    Step("tests-1worker", 75, "the gpu-marked tests, clusters of one dask-cuda worker per GPU",
         ("cuda", "dask_cuda", "pytest"), _pytest("pytest-1worker.xml"),
         env={"QUIVER_TEST_WORKERS_PER_GPU": "1"}, junit_out="pytest-1worker.xml"),
    Step("tests-2workers", 50, "the gpu-marked cluster tests again, two dask-cuda workers sharing each GPU "
         "(the cross-worker device path)", ("cuda", "dask_cuda", "pytest"),
         _pytest("pytest-2workers.xml", "workers_per_gpu"),
         env={"QUIVER_TEST_WORKERS_PER_GPU": "2"}, junit_out="pytest-2workers.xml"),
    Step("replicas", 45, "SMA replica throughput by replicas per GPU, 1 up to the auto-tuner's stop, "
         "batch 16 and 64, and the tuner's choice", ("cuda", "dask_cuda", "mlxtend"),
         _steps_py("replicas", ("--batches", "16,64", "--max-replicas", "64"),
                   ("--device", "cpu", "--batches", "16", "--max-replicas", "3")), json_out="replicas.json"),
    Step("packing", 40, "packed training branches vs one configuration at a time, samples/s "
         "(benchmarks/packing.py on the GPU)", ("cuda", "mlxtend"),
         lambda ctx: [ctx.py, str(HERE / "packing.py"), *ctx.pick(["--device", "cuda", "--repeats", "2"], ["--quick"]),
                      "--output", str(ctx.work / "packing.json")], json_out="packing.json"),
    Step("tta", 85, "time to a stated accuracy: SMA (auto replicas, batch 16) vs S-SGD, each lr tuned "
         "(benchmarks/sma_vs_ssgd.py --quick on one dask-cuda worker)", ("cuda", "dask_cuda"),
         lambda ctx: [ctx.py, str(HERE / "sma_vs_ssgd.py"), "--quick",
                      *ctx.pick(["--device", "cuda", "--workers", "1", "--lr-grid", "0.01,0.03,0.1,0.3"],
                                ["--workers", "2", "--lr-grid", "0.1,0.3"]),
                      "--out", str(ctx.work / "tta.json")], json_out="tta.json"),
    Step("allreduce", 60, "all-reduce of device buffers between two workers sharing the GPU, 1 KB-64 MB, "
         "over tcp and (if it travelled) ucxx", ("cuda", "dask_cuda", "cupy"),
         _steps_py("allreduce", ("--protocols", "tcp,ucxx"),
                   ("--device", "cpu", "--protocols", "tcp", "--max-bytes", str(1 << 20))), json_out="allreduce.json"),
    Step("cudf", 15, "a cudf exploration under a device memory budget, or why cudf could not travel",
         (), lambda ctx: [ctx.py, str(HERE / "gpu_steps.py"), "cudf", "--out", str(ctx.work / "cudf.json"),
                          *gpu_test_files()], json_out="cudf.json"),
]


_cuda_cache: dict[str, str | None] = {}


def _cuda_missing() -> str | None:
    """Why there is no usable CUDA device here (``None`` when there is one)."""
    if "why" not in _cuda_cache:
        try:
            import torch

            ok = torch.cuda.is_available()
            _cuda_cache["why"] = None if ok else (
                f"no CUDA device: torch {torch.__version__} says torch.cuda.is_available() is False")
        except Exception as exc:  # noqa: BLE001
            _cuda_cache["why"] = f"torch does not import: {type(exc).__name__}: {exc}"
    return _cuda_cache["why"]


def preflight(step: Step, device: str = "cuda") -> str | None:
    """``None`` if the step can run here, else why not (naming what to do about it)."""
    for need in step.needs:
        if need in GPU_ONLY and device == "cpu":
            continue
        if need == "cuda":
            why = _cuda_missing()
            if why:
                return why
        elif importlib.util.find_spec(need) is None:
            hint = ("it comes with the carried wheels: run make gpu-wheels, carry .whl"
                    if need in ("dask_cuda", "mlxtend") else "the GPU machine's image should have it")
            return f"{need} is not installed ({hint})"
    return None


def _junit(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"error": f"unreadable junit XML: {exc}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    cases = []
    for case in root.iter("testcase"):
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, msg = tag, (el.get("message") or "")[:300]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time", 0)), "message": msg})
    return {**counts, "cases": cases}


def run_step(step: Step, ctx: Context, box: float) -> dict:
    """Run one step in its own process group within ``box`` seconds; its record."""
    cmd = step.command(ctx)
    rec: dict = {"step": step.name, "what": step.what, "box_s": round(box, 1), "command": shlex.join(cmd),
                 "env": step.env}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **step.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    tail: deque[str] = deque(maxlen=30)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(f"  [{step.name}] {line}")
            sys.stdout.flush()
            tail.append(line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=box)
        rec["status"], rec["rc"] = ("ok" if rc == 0 else "failed"), rc
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        rec["status"], rec["rc"] = "timeout", None
        rec["reason"] = f"ran past its {box:.0f} s time box: killed with its process group"
    _kill_group(proc.pid, signal.SIGKILL)  # stragglers (a Dask worker left behind) free the GPU
    reader.join(5)
    rec["seconds"] = round(time.monotonic() - t0, 2)
    if step.json_out:
        path = ctx.work / step.json_out
        if path.exists():
            try:
                rec["result"] = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                rec["result_error"] = f"{path.name} unreadable: {exc}"
            rec["partial"] = rec["status"] != "ok"
    if step.junit_out:
        rec["result"] = _junit(ctx.out / step.junit_out)
    if rec["status"] != "ok":
        rec["log_tail"] = list(tail)
    return rec


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------- summary


def _num(v) -> str:
    """A figure for a summary line ("n/r": not reached)."""
    return "n/r" if v is None else f"{v:.2f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def _headline(rec: dict) -> str:
    r = rec.get("result") or {}
    try:
        name = rec["step"]
        if name == "install":
            return rec.get("reason", "")
        if name == "versions":
            pk = r.get("packages", {})
            devs = [d.get("name") for d in r.get("torch_cuda", {}).get("devices", [])]
            return (f"torch {pk.get('torch', '? ').split()[0]}, GPUs {devs}, dask_cuda {pk.get('dask_cuda', '?')[:40]}, "
                    f"ucxx {pk.get('distributed_ucxx', '?')[:40]}, driver {r.get('driver')}")
        if name.startswith("tests"):
            bad = [c["test"] for c in r.get("cases", []) if c["outcome"] in ("failure", "error")]
            return (f"{r.get('passed')} passed, {r.get('failures', 0) + r.get('errors', 0)} failed, "
                    f"{r.get('skipped')} skipped" + (f"; failing: {bad}" if bad else ""))
        if name == "replicas":
            return "; ".join(f"batch {x['batch']}: chose {x['chosen_replicas']} ({x['stop']}), best "
                             f"{max(v for _, v in x['curve_replicas_samples_per_s']):.0f} samples/s (synchronised: "
                             f"{max((v for _, v in x.get('synced_curve_replicas_samples_per_s') or []), default=0):.0f})"
                             for x in r.get("runs", []))
        if name == "packing":
            sps = r.get("samples_per_second", {})
            return (f"alone {sps.get('alone', 0):.0f}, packed {sps.get('packed', 0):.0f} "
                    f"({r.get('speedup_packed', 0):.2f}x), auto {sps.get('packed_auto', 0):.0f} samples/s; "
                    f"reports agree: {r.get('reports_identical')}")
        if name == "tta":
            out = []
            for ds, d in r.get("datasets", {}).items():
                s, v = d.get("summary", {}), d.get("verdict", {})
                out.append(f"{ds} to {d.get('target')}: " + ", ".join(
                    f"{m} {_num(s[m].get('seconds_to_target_median'))} s/{_num(s[m].get('epochs_to_target_median'))} ep"
                    for m in s) + f"; SMA {_num(v.get('speedup'))}x sooner than {v.get('best_ssgd')}")
            return "; ".join(out)
        if name == "allreduce":
            out = []
            for proto, p in r.get("protocols", {}).items():
                if p.get("status") != "ok":
                    out.append(f"{proto}: {p.get('status')} ({p.get('reason') or p.get('error')})")
                    continue
                dev = r.get("device", "cuda")
                secs = p["members"][0][f"ring/{dev}"]["seconds_by_bytes"]
                big = max(secs, key=int)
                out.append(f"{proto}: {int(big) >> 20} MB ring on {dev} {1e3 * secs[big]:.1f} ms "
                           f"({int(big) / secs[big] / 1e9:.2f} GB/s), sums right: {p.get('correct')}")
            return "; ".join(out)
        if name == "cudf":
            return r.get("reason") or f"tests {r.get('status')}"
    except Exception as exc:  # noqa: BLE001 - a summary line must never stop the check
        return f"(no headline: {type(exc).__name__}: {exc})"
    return ""


def summarize(records: list[dict]) -> str:
    """One line per step: status, seconds of its box, and its headline figures."""
    lines = [f"{'step':<15} {'status':<9} {'s / box':>11}  headline"]
    for rec in records:
        took = f"{rec.get('seconds', 0):.0f}/{rec.get('box_s', 0):.0f}"
        if rec["status"] in ("skipped", "would-skip"):
            head = rec.get("reason")
        elif rec["status"] == "would-run":
            head = rec.get("setup") or "would run"
        elif rec["status"] in ("failed", "timeout"):
            head = "; ".join(x for x in (rec.get("reason") or f"exit {rec.get('rc')}",
                                         _headline(rec) if rec.get("result") else "") if x)
        else:
            head = _headline(rec)
        lines.append(f"{rec['step']:<15} {rec['status']:<9} {took:>11}  {head}")
    return "\n".join(lines) + "\n"


def _record(ctx: Context, records: list[dict], rec: dict) -> None:
    records.append(rec)
    with open(ctx.out / "results.jsonl", "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    (ctx.out / "summary.txt").write_text(summarize(records))


# --------------------------------------------------------------------------------- main


_collected: dict[str, list[str]] = {}


def _collect(ctx: Context) -> list[str]:
    """Node ids of the gpu-marked tests, collected once for the whole dry run."""
    if "ids" not in _collected:
        cmd = [ctx.py, "-m", "pytest", "--collect-only", "-q", *gpu_test_files(), "-m", "gpu",
               "-p", "no:cacheprovider", "-o", "addopts="]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        _collected["ids"] = [ln.strip() for ln in p.stdout.splitlines() if "::" in ln]
        _collected["tail"] = [(p.stdout.strip().splitlines() or [p.stderr.strip()[-200:]])[-1]]
    return _collected["ids"]


def _dry_setup(step: Step, ctx: Context) -> str | None:
    """What a dry run does of a step's set-up here: the versions probe without imports,
    pytest's collection of the gpu tests, and the cudf step itself when cudf is absent (it
    only records why); returns a line to print."""
    if step.name == "cudf" and importlib.util.find_spec("cudf") is None:
        p = subprocess.run(step.command(ctx), cwd=ROOT, capture_output=True, text=True, timeout=60)
        return "set-up: " + (p.stdout.strip() or p.stderr.strip()[-300:])
    if step.name == "versions":
        p = subprocess.run([ctx.py, str(HERE / "gpu_steps.py"), "versions", "--no-import", "--out",
                            str(ctx.work / "versions.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
        return "set-up: versions probe (no imports): " + ("ok" if p.returncode == 0 else p.stderr.strip()[-300:])
    if step.junit_out:
        files = [x for x in step.command(ctx) if x.startswith("tests/")]
        tests = [t for t in _collect(ctx) if t.split("::")[0] in files]
        return (f"set-up: pytest collects {len(tests)} gpu test(s) from {', '.join(files)}: "
                + ", ".join(t.split("::", 1)[1] for t in tests))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where results go ($OUT on the device)")
    ap.add_argument("--python", default=sys.executable, help="the Python each step runs with")
    ap.add_argument("--start", type=float, default=None, help="epoch seconds the whole check started at")
    ap.add_argument("--budget", type=float, default=460, help="seconds for the whole check, install included")
    ap.add_argument("--only", default="", help="comma list of steps to run (a rerun)")
    ap.add_argument("--skip", default="", help="comma list of steps to leave out")
    ap.add_argument("--dry-run", action="store_true", help="print what each step would do; run set-ups only")
    ap.add_argument("--cpu", action="store_true",
                    help="smoke mode for a machine without a GPU: the same steps on CPU workers, small sizes")
    ap.add_argument("--install-status", default="skipped")
    ap.add_argument("--install-seconds", type=float, default=0.0)
    ap.add_argument("--install-reason", default="")
    a = ap.parse_args(argv)

    names = [s.name for s in STEPS]
    only = [n for n in a.only.split(",") if n]
    skip = [n for n in a.skip.split(",") if n]
    unknown = [n for n in only + skip if n not in names]
    if unknown:
        ap.error(f"unknown step(s) {unknown}; the steps are: {', '.join(names)}")
    start = a.start or time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="quiver-gpu-check-"))  # the steps' JSON, folded into results.jsonl
    ctx = Context(py=a.python, out=a.out, work=work, deadline=start + a.budget, dry_run=a.dry_run,
                  device="cpu" if a.cpu else "cuda")
    records: list[dict] = []
    _record(ctx, records, {"step": "install", "status": a.install_status, "seconds": a.install_seconds,
                           "box_s": a.install_seconds, "reason": a.install_reason})
    print(f"gpu_check: {'DRY RUN, ' if a.dry_run else ''}{'CPU SMOKE MODE, ' if a.cpu else ''}budget {a.budget:.0f} s "
          f"({time.time() - start:.0f} s spent before the steps), results in {a.out}")
    for step in STEPS:
        print(f"\n== {step.name} (time box {step.box} s): {step.what}")
        print(f"   command: {shlex.join(step.command(ctx))}" + (f"  env {step.env}" if step.env else ""))
        if (only and step.name not in only) or step.name in skip:
            _record(ctx, records, {"step": step.name, "status": "skipped", "reason": "not selected (--only/--skip)"})
            print("   skipped: not selected (--only/--skip)")
            continue
        why = preflight(step, ctx.device)
        if a.dry_run:
            line = _dry_setup(step, ctx)
            if line:
                print(f"   {line}")
            verdict = f"would skip: {why}" if why else "would run"
            print(f"   {verdict}")
            _record(ctx, records, {"step": step.name, "status": "would-skip" if why else "would-run",
                                   "box_s": step.box, "reason": why or "", "setup": line,
                                   "command": shlex.join(step.command(ctx))})
            continue
        left = ctx.deadline - time.time() - 2
        if why or left < MIN_BOX:
            why = why or f"budget spent: {max(left, 0):.0f} s left of {a.budget:.0f} s"
            print(f"   skipped: {why}")
            _record(ctx, records, {"step": step.name, "status": "skipped", "reason": why, "box_s": step.box})
            continue
        rec = run_step(step, ctx, min(step.box, left))
        print(f"   {rec['status']} in {rec['seconds']:.0f} s" + (f": {rec['reason']}" if rec.get("reason") else ""))
        _record(ctx, records, rec)
    shutil.rmtree(work, ignore_errors=True)  # its JSON is in results.jsonl now
    print("\n" + summarize(records))
    files = [p for p in a.out.rglob("*") if p.is_file()]
    if len(files) > OUT_FILE_LIMIT:
        print(f"WARNING: {len(files)} files in {a.out}; the device brings back {OUT_FILE_LIMIT}")
    print(f"gpu_check: done in {time.time() - start:.0f} s; {len(files)} files in {a.out}")
    bad = [r["step"] for r in records if r["status"] in ("failed", "timeout")]
    if bad:
        print(f"gpu_check: steps that failed or ran out of time: {', '.join(bad)} (see summary.txt, log.txt)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
