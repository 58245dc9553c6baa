"""A script that sets a ``distributed.*`` option around a run, before anything imported
``distributed`` (Quiver imports it only when a run needs it), keeps distributed's whole
configuration when the block ends (graph/daskdefaults.py), in either import order, and its
kept cluster and next run still work. Fresh interpreters: the case needs ``distributed`` not
imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFIG_ONLY = r'''
import json, sys
{imports}
with dask.config.set({{"distributed.scheduler.work-stealing": False}}):
    inside = dask.config.get("distributed.scheduler.work-stealing")
print(json.dumps({{"inside": inside, "after": dask.config.get("distributed.scheduler.work-stealing"),
                  "connect": dask.config.get("distributed.comm.timeouts.connect", None),
                  "distributed_imported": "distributed" in sys.modules}}))
'''

TWO_RUNS = r'''
import json
import dask
from pipelines import Pipeline, grid

def src(n):
    return list(range(n))

def f(d, a):
    return {"m": sum(d) * a}

node = Pipeline("cfg").source(src, n=10).explore("a", grid(f, a=[1, 2])).choose("m")
with dask.config.set({"distributed.scheduler.work-stealing": False}):
    first = node.run(progress=False, quiet=True, workers=2).value["m"]
second = node.run(progress=False, quiet=True, workers=2)
print(json.dumps([first, second.value["m"], second.stats["cluster"],
                  dask.config.get("distributed.scheduler.work-stealing")]))
'''


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.mark.parametrize("imports", ["import pipelines\nimport dask", "import dask\nimport pipelines"],
                         ids=["pipelines-first", "dask-first"])
def test_a_set_block_before_distributed_is_imported_leaves_its_defaults(imports):
    out = _python(CONFIG_ONLY.format(imports=imports))
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # without graph.daskdefaults: "after" raises KeyError ('distributed' was inserted by the set,
    # so its exit removed the whole section)
    assert seen == {"inside": False, "after": True, "connect": "30s", "distributed_imported": False}


def test_without_quiver_dask_loses_the_section_so_the_case_is_real():
    # Dask alone, distributed imported inside the block (as a run does): the section goes
    out = _python("import json, dask\n"
                  "with dask.config.set({'distributed.scheduler.work-stealing': False}):\n"
                  "    import distributed\n"
                  "print(json.dumps(dask.config.get('distributed', None)))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) is None


@pytest.mark.slow
def test_a_run_inside_such_a_block_leaves_a_working_kept_cluster_for_the_next_run():
    out = _python(TWO_RUNS, timeout=240)
    assert out.returncode == 0, out.stderr
    first, second, cluster, stealing = json.loads(out.stdout.strip().splitlines()[-1])
    assert (first, second, cluster, stealing) == (90, 90, "reused", True)
    assert "KeyError" not in out.stderr, out.stderr
