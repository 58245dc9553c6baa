"""Two checkouts of Quiver timed against each other, interleaved, on benchmarks/common_cases.py's
workloads: one fresh process per (checkout, repeat), old and new in turn so a busy minute hits
both alike; medians of the first and second calls, and new / old.

    python benchmarks/interleaved_commits.py OLD_DIR NEW_DIR --workloads dropin36,digits --repeats 5

Each checkout runs its own ``benchmarks/common_cases.py --one WORKLOAD quiver`` with its own tree
first on ``PYTHONPATH`` (the same virtual environment: this interpreter's). Used for issue 50's
"no behaviour change" check (the fence against the commit before it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def one(tree: Path, workload: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run([sys.executable, str(tree / "benchmarks" / "common_cases.py"), "--one", workload, "quiver"],
                       capture_output=True, text=True, env=env, cwd=tree, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--workloads", default="dropin36,digits")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    runs: dict = {}
    for workload in args.workloads.split(","):
        for r in range(args.repeats):
            for label, tree in (("old", args.old), ("new", args.new)):
                out = one(tree.resolve(), workload)
                runs.setdefault(workload, {}).setdefault(label, []).append(out)
                print(f"[{workload} {r + 1}/{args.repeats}] {label}: "
                      + (out.get("error") or f"first {out['first_s']:.2f} s, second {out['second_s']:.2f} s"), flush=True)
    summary = {}
    for workload, by in runs.items():
        med = {label: {k: statistics.median(x[k] for x in xs if k in x) for k in ("first_s", "second_s")}
               for label, xs in by.items() if any("first_s" in x for x in xs)}
        if len(med) == 2:
            summary[workload] = {**med, "ratio": {k: med["new"][k] / med["old"][k] for k in ("first_s", "second_s")}}
            print(f"{workload}: old first {med['old']['first_s']:.2f} / second {med['old']['second_s']:.2f} s; "
                  f"new {med['new']['first_s']:.2f} / {med['new']['second_s']:.2f} s; new/old "
                  f"{summary[workload]['ratio']['first_s']:.3f} / {summary[workload]['ratio']['second_s']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
