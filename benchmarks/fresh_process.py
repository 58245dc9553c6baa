"""One measured run in a new Python process, its result read back (as ``python script.py`` runs).

A benchmark whose clock must include what a fresh process pays (importing torch, starting a
cluster and its fork server) runs that method as a child of itself: the child prints its
result with :func:`report`, the parent reads it with :func:`run_fresh`. ``staged_training.py``
runs every method so; ``train_explore.py`` its cold Quiver rows.

>>> import json
>>> parse = lambda stdout: json.loads([l for l in stdout.splitlines() if l.startswith(PREFIX)][-1][len(PREFIX):])
>>> parse("noise\\nRESULT {\\"wall_s\\": 1.5}\\n")
{'wall_s': 1.5}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "RESULT "  # the line that carries a child's result; anything else it prints is ignored


def report(out: dict) -> None:
    """In the child: print ``out`` as the run's result."""
    print(PREFIX + json.dumps(out, default=str), flush=True)


def run_fresh(script: str | Path, args: list[str], label: str, timeout: float) -> dict:
    """Run ``python script *args`` from the repository root (with it on ``PYTHONPATH``) and return
    the last result it reported; a ``RuntimeError`` with its output's tail if it failed or reported none."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{label} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
    return json.loads(lines[-1][len(PREFIX):])
