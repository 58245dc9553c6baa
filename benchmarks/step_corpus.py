"""Issue 44's campaign: ordinary step code, run many times on every kind of cluster, fresh each time.

The README's first example as pasted (``readme``: its own embedded cluster), and three pipeline
files (``benchmarks/corpus/``): ``newcomer.py`` (the issue's pipeline: scikit-learn
imported inside step bodies, scalers travelling as values), ``good_steps.py`` (every branch must
succeed: imports in bodies, caches, closures, lambdas, partials, a generator torch loop, a class
with ``__getstate__``, pandas / NumPy / torch / scikit-learn values, a 110 MB value, steps that
print, warn, log, start threads or use joblib) and ``bad_steps.py`` (genuine failures: a value
holding a lock, a package the worker lacks, a ``ValueError``; every other branch must succeed).

Cluster kinds, each run in a fresh process with a fresh cluster:
``embedded`` (``quiver run FILE``: Quiver's LocalCluster of processes), ``cli`` (``dask scheduler``
+ ``dask worker --nworkers 2 --nthreads 1``, nannies), ``cli-no-nanny`` (two ``dask worker
--no-nanny --nthreads 1``), ``threads`` (``LocalCluster(processes=False)``, 2 workers).

Per run it checks: no spurious failure (a failed branch that should not fail), the exit status,
for the bad corpus that each failure is reported as what it is (``error_kind``, the user's file and
line in the traceback), and that a run where nothing failed prints no ``distributed ... ERROR``
line and no traceback.

    python benchmarks/step_corpus.py --runs 20 --kinds cli --corpus newcomer
    python benchmarks/step_corpus.py --runs 50          # every kind, every corpus file
    python benchmarks/step_corpus.py --runs 3 --kinds cli --corpus newcomer --trace /tmp/deadlocks
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "corpus"
PY = sys.executable
BIN = Path(sys.executable).parent
KINDS = ("embedded", "cli", "cli-no-nanny", "threads")
FILES = ("newcomer", "good", "bad", "readme")
#: a folder where CLI workers write every thread's stack when the import system detects a deadlock
#: (``--trace DIR``: ``benchmarks/corpus/deadlock_probe.py`` preloaded on each worker)
TRACE = ""
NOISE = re.compile(r"distributed\.\S+ - ERROR|Traceback \(most recent call last\)")

_THREADS = """
import sys
from distributed import Client, LocalCluster
from pipelines.cli import load_node, _failures_status
from pipelines.export import payload, write_json
if __name__ == "__main__":
    node = load_node(sys.argv[1])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cl, Client(cl) as c:
        r = node.run(c, progress=False)
    write_json(sys.argv[2], payload(r.table, r.stats, compiled=r.compiled))
    sys.exit(_failures_status(r.table, False))
"""


def _file(name: str) -> Path:
    return CORPUS / ("newcomer.py" if name == "newcomer" else f"{name}_steps.py")


def readme_example() -> str:
    """The README's first example (the first python block under "## A first example"), as pasted."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## A first example\n")
    section = text[start:text.find("\n## ", start + 1)]
    return re.search(r"^```python\n(.*?)^```$", section, flags=re.S | re.M).group(1)


def _wait_file(path: Path, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.1)


def _cluster(kind: str, tmp: Path) -> tuple[list, str]:
    """Start a fresh CLI scheduler and workers; (their processes, the scheduler's address)."""
    sfile = tmp / "scheduler.json"
    logs = open(tmp / "cluster.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the workers unpickle this checkout's classes
    trace = ["--preload", "deadlock_probe"] if TRACE else []  # by module name (a file path's preload did not reproduce)
    if TRACE:
        env["QUIVER_TRACE_DIR"] = TRACE
        env["PYTHONPATH"] += os.pathsep + str(CORPUS)
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--scheduler-file", str(sfile), "--port", "0",
                               "--dashboard-address", ":0"], stdout=logs, stderr=logs, cwd=tmp, env=env)]
    _wait_file(sfile)
    workers = ([["--nworkers", "2"]] if kind == "cli" else [["--no-nanny"], ["--no-nanny"]])
    for extra in workers:
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", "--scheduler-file", str(sfile), "--nthreads", "1",
                                       *extra, *trace], stdout=logs, stderr=logs, cwd=tmp, env=env))
    from distributed import Client

    address = json.loads(sfile.read_text())["address"]
    with Client(address, timeout=60) as c:
        c.wait_for_workers(2, timeout=120)
    return procs, address


def run_once(kind: str, corpus: str) -> dict:
    """One fresh run; what it showed."""
    with tempfile.TemporaryDirectory(prefix="quiver-corpus-") as d:
        tmp = Path(d)
        out = tmp / "out.json"
        procs: list = []
        try:
            if corpus == "readme":  # the README's example, as pasted, in its own script (its cluster: embedded)
                (tmp / "first.py").write_text(readme_example())
                cmd = [PY, "first.py"]
            elif kind == "threads":
                cmd = [PY, "-c", _THREADS, str(_file(corpus)), str(out)]
            else:
                cmd = [str(BIN / "quiver"), "run", str(_file(corpus)), "--no-progress", "--json", str(out)]
                if kind != "embedded":
                    procs, address = _cluster(kind, tmp)
                    cmd += ["--scheduler", address]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=600,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
            wall = time.perf_counter() - t0
        finally:
            for q in procs:
                q.terminate()
            for q in procs:
                try:
                    q.wait(20)
                except subprocess.TimeoutExpired:
                    q.kill()
        text = p.stdout + p.stderr
        rows = json.loads(out.read_text())["table"] if out.exists() else []
        if corpus == "readme":  # no JSON: its printed table's rows (8 branches, one chosen)
            rows = [{"status": line.split()[-2]} for line in p.stdout.splitlines()  # ... status chosen
                    if line.rstrip().endswith(("True", "False"))]
    return judge(corpus, p.returncode, rows, text, in_process=kind == "threads") | {"kind": kind, "corpus": corpus, "wall": round(wall, 2)}


def judge(corpus: str, rc: int, rows: list, text: str, in_process: bool = False) -> dict:
    """The run's verdict: spurious failures, wrong reports, noise in a run with no failure.
    ``in_process``: the workers share the client's process (``processes=False``), where a value
    holding a lock never needs pickling, so its branches succeed."""
    failed = [r for r in rows if r.get("status") == "failed"]
    wrong: list[str] = []
    if corpus == "bad":
        expect = {"missing": "step", "raises": "step"} if in_process else {"lock": "serialisation", "missing": "step", "raises": "step"}
        spurious = [r for r in failed if r.get("prep") not in expect or (r["prep"] == "raises" and r.get("prep.threshold") == 0)]
        for r in failed:
            kind = expect.get(r.get("prep"))
            if kind and r.get("error_kind") != kind:
                wrong.append(f"{r.get('prep')}: error_kind {r.get('error_kind')!r}, expected {kind!r}")
            if r.get("prep") in ("missing", "raises") and "bad_steps.py\", line" not in (r.get("traceback") or ""):
                wrong.append(f"{r.get('prep')}: the traceback does not name the user's file and line")
            if r.get("prep") == "lock" and "with_lock" not in (r.get("error") or ""):
                wrong.append("lock: the error does not name the step")
        if len(failed) != (4 if in_process else 6):
            wrong.append(f"{len(failed)} failed branches, expected {4 if in_process else 6}")
        if rc != (0 if in_process else 1):
            wrong.append(f"exit status {rc}, expected {0 if in_process else 1} (1: a value that cannot be pickled)")
        if not in_process and not re.search(r"quiver: error: branch \d+ \(.*\): ValueCannotTravel: step with_lock", text):
            wrong.append("no RunError naming the branch and the step whose value cannot be pickled")
    else:
        spurious = failed
        if rc != 0:
            wrong.append(f"exit status {rc}")
    if not rows:
        wrong.append("no table: " + text.strip().splitlines()[-1][:200] if text.strip() else "no table, no output")
    noisy = not failed and bool(NOISE.search(text))
    return {"branches": len(rows), "failed": len(failed), "spurious": len(spurious), "wrong": wrong,
            "noisy": noisy, "noise": [l[:200] for l in text.splitlines() if NOISE.search(l)][:3],
            "errors": sorted({(r.get("error") or "")[:120] for r in spurious})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh runs per cluster kind and corpus file")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--corpus", default=",".join(FILES))
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "step_corpus.json"))
    ap.add_argument("--trace", metavar="DIR", default="",
                    help="CLI workers write every thread's stack to DIR when Python detects an import deadlock")
    args = ap.parse_args(argv)
    global TRACE
    TRACE = str(Path(args.trace).resolve()) if args.trace else ""
    results = []
    for i in range(args.runs):  # round after round, so that a campaign cut short stays balanced
        for kind, corpus in ((k, c) for k in args.kinds.split(",") for c in args.corpus.split(",")):
            if corpus == "readme" and kind != "embedded":
                continue  # the README's example starts its own embedded cluster
            r = run_once(kind, corpus)
            results.append(r)
            flag = "ok" if not (r["spurious"] or r["wrong"] or r["noisy"]) else "PROBLEM"
            print(f"{kind:13s} {corpus:9s} run {i + 1:3d}: {r['branches']} branches, {r['failed']} failed, "
                  f"{r['spurious']} spurious, wall {r['wall']:.1f}s {flag} {r['wrong'] or ''} {r['noise'] if r['noisy'] else ''}",
                  flush=True)
            _save(args.json, results)
    print("\nkind          corpus    runs  spurious-failures  runs-with-noise  wrong-reports")
    bad = 0
    for kind in args.kinds.split(","):
        for corpus in args.corpus.split(","):
            rs = [r for r in results if r["kind"] == kind and r["corpus"] == corpus]
            if not rs:
                continue
            sp = sum(r["spurious"] for r in rs)
            nz = sum(r["noisy"] for r in rs)
            wr = sum(bool(r["wrong"]) for r in rs)
            bad += sp + nz + wr
            print(f"{kind:13s} {corpus:9s} {len(rs):4d}  {sp:17d}  {nz:15d}  {wr:13d}")
    _save(args.json, results)
    return 1 if bad else 0


def _save(path: str, results: list) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
