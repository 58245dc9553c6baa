"""Run a snippet in a fresh interpreter from the repository and return what it printed: the
import and worker-start tests check what a new process loads, which the test process cannot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_prints(code: str, timeout: float = 120) -> str:
    """What ``python -c code`` prints (stripped), run from the repository in a fresh interpreter
    (so nothing this test process imported counts); its stderr is the failure message."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()
