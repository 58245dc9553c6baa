"""An embedded cluster's workers are forks of one prepared process (graph.cluster.workerstart): they
start with the run's installed step modules imported, never with a stale copy of the user's own
modules, with this process's environment, and only when the prepared process's allocator and
thread settings are the ones the workers need (else Dask's ``spawn``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graph.cluster.workerstart import preloadable, start_method
from tests.fresh_python import python_prints

ROOT = Path(__file__).resolve().parents[1]

ENV_FAST = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}


def test_forkserver_when_none_runs_or_it_started_with_the_same_environment():
    assert start_method(ENV_FAST, None, available=True) == "forkserver"
    assert start_method(ENV_FAST, dict(ENV_FAST), available=True) == "forkserver"


def test_spawn_when_the_environment_differs_the_platform_lacks_it_or_config_says_so():
    budget = dict(ENV_FAST, MALLOC_MMAP_THRESHOLD_="131072")
    assert start_method(budget, ENV_FAST, available=True) == "spawn"
    assert start_method(dict(ENV_FAST, OMP_NUM_THREADS=None), ENV_FAST, available=True) == "spawn"
    assert start_method(ENV_FAST, None, available=False) == "spawn"
    assert start_method(ENV_FAST, None, available=True, configured="spawn") == "spawn"
    # under a memory budget a fork's resident memory would count the server's pages as the worker's
    assert start_method(ENV_FAST, ENV_FAST, available=True, budgeted=True) == "spawn"


def test_a_bad_start_method_names_the_config_key_and_the_choices():
    with pytest.raises(ValueError, match=r"quiver.embedded-cluster.start-method.*'fork'.*forkserver.*spawn"):
        start_method(ENV_FAST, None, available=True, configured="fork")


def test_only_installed_modules_and_quivers_own_are_preloaded():
    files = {
        "sklearn.svm._classes": "/venv/lib/site-packages/sklearn/svm/_classes.py",
        "json.decoder": "/usr/lib/python3.11/json/decoder.py",
        "my_steps": "/home/me/work/my_steps.py",  # the user's own: imported fresh by each worker
        "pipelines.sklearn.steps": "/src/quiver/pipelines/sklearn/steps.py",
        "sitecustom_lookalike": "/venv/lib/site-packages-old/x.py",  # a prefix is not a parent
        "builtin_mod": None,
    }
    assert preloadable(files, ["/venv/lib/site-packages", "/usr/lib/python3.11/"]) == [
        "json.decoder", "pipelines.sklearn.steps", "sklearn.svm._classes"]


SCRIPT = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import my_user_steps                      # the user's own module: never preloaded
import sklearn.svm._classes               # an installed one: preloaded
import dask
from graph.cluster.connect import connect
import graph.cluster.embedded as embedded

def probe():
    return {"ppid": os.getppid(), "svm": "sklearn.svm._classes" in sys.modules,
            "user": "my_user_steps" in sys.modules, "var": os.environ.get("QUIVER_START_PROBE"),
            "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_")}

out = {"me": os.getpid()}
mods = ["sklearn.svm._classes", "my_user_steps"]
with dask.config.set({"quiver.embedded-cluster.idle-timeout": 0}):
    info = {}
    with connect(n_workers=2, quiet=True, preload=mods, info=info) as c:
        out["first"] = {"method": info["start_method"], "workers": list(c.run(probe).values())}
    os.environ["QUIVER_START_PROBE"] = "set-after-the-server-started"
    info = {}
    with connect(n_workers=1, quiet=True, preload=mods, info=info) as c:
        out["second"] = {"method": info["start_method"], "workers": list(c.run(probe).values())}
    info = {}
    with connect(n_workers=1, quiet=True, memory_budget="600 MiB", info=info) as c:
        out["budget"] = {"method": info["start_method"], "workers": list(c.run(probe).values())}
    info = {}
    with dask.config.set({"quiver.embedded-cluster.start-method": "spawn"}):
        with connect(n_workers=1, quiet=True, preload=mods, info=info) as c:
            out["spawn"] = {"method": info["start_method"], "workers": list(c.run(probe).values())}
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_embedded_workers_are_forks_with_installed_step_modules_and_this_process_environment(tmp_path):
    (tmp_path / "my_user_steps.py").write_text("def step(x):\n    return x\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("QUIVER_START_PROBE", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    me = out["me"]

    first = out["first"]
    assert first["method"] == "forkserver"
    assert len(first["workers"]) == 2
    for w in first["workers"]:
        assert w["ppid"] != me          # a fork of the server, not a child of this process
        assert w["svm"] is True         # imported before the worker ran anything
        assert w["user"] is False       # the user's module is not carried over from the server
        assert w["mmap"] == "33554432"  # Quiver's allocator setting (graph.cluster.workerenv)

    second = out["second"]              # the same server, a variable set since it started
    assert second["method"] == "forkserver"
    assert [w["var"] for w in second["workers"]] == ["set-after-the-server-started"]
    assert second["workers"][0]["ppid"] == first["workers"][0]["ppid"]

    budget = out["budget"]              # a memory budget: Dask's spawn, from this process
    assert budget["method"] == "spawn"
    assert budget["workers"][0]["ppid"] == me and budget["workers"][0]["mmap"] == "131072"

    spawned = out["spawn"]              # config switched off
    assert spawned["method"] == "spawn"
    assert spawned["workers"][0]["ppid"] == me and spawned["workers"][0]["svm"] is False




FAILING = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["QUIVER_TEST_PARENT"] = str(os.getpid())
import explodes_in_server               # fine here; raises in any other process (the server)
import sklearn.svm._classes
import dask
import graph.cluster.workerstart as ws
from graph.cluster.connect import connect

purelib = __import__("sysconfig").get_paths()["purelib"]
ws._roots = lambda: [sys.argv[1], purelib]  # the test's module counts as installed

def probe():
    return {"bad": "explodes_in_server" in sys.modules, "svm": "sklearn.svm._classes" in sys.modules}

out = {}
with dask.config.set({"quiver.embedded-cluster.idle-timeout": 0}):
    info = {}
    with connect(n_workers=1, quiet=True, preload=["explodes_in_server", "sklearn.svm._classes"], info=info) as c:
        out = {"method": info["start_method"], "answer": c.submit(sum, [1, 2]).result(),
               "workers": list(c.run(probe).values())}
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_module_failing_in_the_prepared_process_leaves_it_serving(tmp_path):
    """Any error of a preloaded module (not only ImportError) stays in graph.cluster.forkserver_preload:
    the server lives on and forks workers, which import that module themselves if they need it."""
    (tmp_path / "explodes_in_server.py").write_text(
        "import os\n"
        "if os.getpid() != int(os.environ['QUIVER_TEST_PARENT']):\n"
        "    raise RuntimeError('this module cannot be imported outside its own process')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", FAILING, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["method"] == "forkserver" and out["answer"] == 3
    assert out["workers"] == [{"bad": False, "svm": True}]  # the others were preloaded all the same


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_a_started_server_leaves_this_process_its_meanwhile_work():
    """``start_workers(meanwhile=...)`` runs the work once, right after it starts the server
    (whose imports it overlaps), never when the server runs already; an embedded cluster's start
    gives it the run's table library (pandas), which a torch script that has not imported it
    would otherwise import after the run's last task, with the workers idle."""
    assert python_prints(r'''
import sys, graph.cluster.workerstart as ws
calls = []
first = ws.start_workers(lambda method: method, {}, (), meanwhile=lambda: calls.append("pandas" in sys.modules))
again = ws.start_workers(lambda method: method, {}, (), meanwhile=lambda: calls.append("again"))
print("RESULT", first[1], again[1], calls)
''') == "RESULT forkserver forkserver [False]"
    assert python_prints(r'''
import sys
from graph.cluster.connect import connect
before = "pandas" in sys.modules
with connect(n_workers=1, quiet=True) as c:
    print("RESULT", before, "pandas" in sys.modules)
''') == "RESULT False True"
