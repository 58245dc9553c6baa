"""Warnings raised in steps (graph.report.stepwarnings): a user's script run as they would run it, whose
step warns and whose scikit-learn fits do not converge, on a real local cluster of 2 worker
processes. Each distinct warning shows once on the console, at the user's file and line, not once
per worker process and not at cloudpickle's ``<dynamic-code>``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent(
    """
    import warnings

    from pipelines import Pipeline, grid


    def load():
        from sklearn.datasets import load_iris

        return load_iris(return_X_y=True)


    def fit(data, C):
        from sklearn.linear_model import LogisticRegression

        X, y = data
        warnings.warn("C is a guess", UserWarning)
        model = LogisticRegression(C=C, max_iter=2).fit(X, y)
        return {"acc": model.score(X, y)}


    if __name__ == "__main__":
        node = Pipeline("warns").source(load).explore("m", grid(fit, C=[0.1, 1.0, 10.0, 100.0])).choose("acc")
        r = node.run(workers=2, progress=False)
        print("STEP_WARNINGS", r.stats["step_warnings"], len(r.table))
    """
)


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_steps_warnings_show_once_at_the_users_file_and_line(tmp_path):
    f = tmp_path / "explore.py"
    f.write_text(SCRIPT)
    line = SCRIPT.splitlines().index('    warnings.warn("C is a guess", UserWarning)') + 1
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(f)], cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STEP_WARNINGS 2 4" in out.stdout, out.stdout
    err = out.stderr
    assert "<dynamic-code>" not in err, err[-3000:]
    # the user's own warning: once, at the script's line, with the step it came from
    assert err.count("UserWarning: C is a guess") == 1, err[-3000:]
    assert re.search(rf"{re.escape(str(f))}:{line}: UserWarning: C is a guess  \[step 'fit', \d tasks?\]", err), err[-3000:]
    assert 'warnings.warn("C is a guess", UserWarning)' in err  # Python shows the source line, as for a local warning
    # scikit-learn's: once for the run, not once per worker process
    assert len(re.findall(r"ConvergenceWarning: lbfgs failed to converge", err)) == 1, err[-3000:]
