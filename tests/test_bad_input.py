"""Bad input, thrown by hypothesis and by hand: every case gets a clear PipelineError (or a one-line
CLI message, exit status 2 for bad arguments) and nothing is half-run.

Extends tests/test_builder_errors.py (which covers the basic definition errors one by one).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graph
from pipelines import Pipeline, PipelineError, RunError, grid
from pipelines.cli import main as cli_main
from tests import steps

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def src():
    return Pipeline("bad").source(steps.source, seed=1)


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if a run gets as far as starting or connecting to a cluster."""
    import graph.cluster.connect

    def refuse(*a, **k):
        raise AssertionError("a cluster was started: the bad input was not refused first")

    monkeypatch.setattr(graph.cluster.connect, "connect", refuse)


# ---- grids -----------------------------------------------------------------------------------------

good_list = st.lists(st.integers(-5, 5), min_size=1, max_size=4, unique=True)
bad_list = st.one_of(
    st.just([]),
    st.integers(),
    st.text(max_size=3),
    st.dictionaries(st.integers(0, 3), st.integers(), min_size=1, max_size=2),
    st.sets(st.integers(0, 9), min_size=1, max_size=3),
    st.none(),
)


@FAST
@given(lists=st.dictionaries(st.sampled_from("abcde"), st.one_of(good_list, bad_list), min_size=1, max_size=4))
def test_grids_are_refused_iff_a_parameter_is_not_a_non_empty_list(src, lists):
    ok = all(isinstance(v, list) and v for v in lists.values())
    if ok:
        node = src.explore("g", grid(steps.anything, **lists))
        assert len(node.compile().branches) == math.prod(len(v) for v in lists.values())
    else:
        with pytest.raises(PipelineError, match=r"pipeline 'bad'.*explore\('g'\).*grid\(anything"):
            src.explore("g", grid(steps.anything, **lists))


ops = st.lists(
    st.one_of(
        st.tuples(st.just("explore"), st.sampled_from("abc"), st.integers(1, 3)),
        st.tuples(st.just("then")),
        st.tuples(st.just("choose"), st.sampled_from([None, 1, 2])),
    ),
    min_size=1,
    max_size=6,
)


@FAST
@given(ops=ops)
def test_random_pipelines_build_exactly_when_well_formed(src, ops):
    """A model of the rules: an explore name may appear once per path, a choose needs an explore
    upstream; everything else builds, and compiles to the task counts the model predicts."""
    node, names, branches, tasks = src, set(), 1, 1
    for op in ops:
        if op[0] == "explore":
            _, name, n = op
            if name in names:
                with pytest.raises(PipelineError, match=f"explore\\('{name}'\\).*already upstream"):
                    node.explore(name, grid(steps.add, n=list(range(n))))
                return
            node = node.explore(name, grid(steps.add, n=list(range(n))))
            names.add(name)
            branches *= n
            tasks += branches
        elif op[0] == "then":
            node = node.then(steps.square)
            tasks += branches
        else:
            if not names:
                with pytest.raises(PipelineError, match="nothing is explored upstream"):
                    node.choose("x", k=op[1])
                return
            node = node.choose("x", k=op[1])
    c = node.compile()
    assert len(c.branches) == branches  # the graph holds every branch a choose might keep
    assert c.unique_tasks == tasks and c.naive_tasks >= c.unique_tasks


def test_a_generator_grid_is_read_once_and_kept(src):
    node = src.explore("g", grid(steps.add, n=(i for i in range(3))))
    assert len(node.compile().branches) == 3


# ---- choose arguments ----------------------------------------------------------------------------


@FAST
@given(
    k=st.one_of(st.none(), st.integers(-2, 4), st.floats(allow_nan=True), st.booleans(), st.text(max_size=2)),
    threshold=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=2)),
    mode=st.sampled_from(["max", "min", "MAX", "", None, 1, "maximum"]),
    per=st.sampled_from([None, "a", "b", "nope", 3]),
)
def test_choose_arguments(src, k, threshold, mode, per):
    node = src.explore("a", grid(steps.add, n=[1, 2])).explore("b", grid(steps.mul, n=[1, 2]))
    valid = (
        mode in ("max", "min")
        and (k is None or (isinstance(k, int) and not isinstance(k, bool) and k >= 1))
        and (threshold is None or (isinstance(threshold, float) and not math.isnan(threshold)))
        and per in (None, "a", "b")
    )
    if valid:
        assert node.choose("x", mode=mode, k=k, threshold=threshold, per=per).compile().chooses
    else:
        with pytest.raises(PipelineError, match=r"pipeline 'bad'.*choose\('x'\): (k|threshold|unknown mode|per)"):
            node.choose("x", mode=mode, k=k, threshold=threshold, per=per)


# ---- parameters: tokens, nodes, pickling -----------------------------------------------------------


class FreshToken:
    """Claims a token, but a different one every time: keys would never repeat."""

    def __dask_tokenize__(self):
        return uuid.uuid4().hex


class StableButUnpicklable:
    """Tokenizes deterministically, but holds a lock, so it cannot travel to a worker."""

    def __init__(self):
        self.lock = threading.Lock()

    def __dask_tokenize__(self):
        return "stable-but-unpicklable"


plain_values = st.one_of(
    st.integers(), st.floats(allow_nan=True), st.text(max_size=5), st.none(), st.booleans(),
    st.tuples(st.integers(), st.text(max_size=3)), st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)
refused_values = st.sampled_from(["object", "lock", "fresh", "node"])


def make(kind, src):
    return {"object": object(), "lock": threading.Lock(), "fresh": FreshToken(), "node": src}[kind]


@FAST
@given(value=st.one_of(plain_values, refused_values.map(lambda k: ("refused", k))))
def test_parameter_values(src, value):
    if isinstance(value, tuple) and value[:1] == ("refused",):
        obj = make(value[1], src)
        with pytest.raises(PipelineError, match=r"parameter 'n'.*(no deterministic token|tokenizes differently|pipeline node)"):
            src.then(steps.add, n=obj)
        with pytest.raises(PipelineError, match=r"parameter 'n'"):
            src.explore("a", grid(steps.add, n=[1, obj]))
    else:
        node = src.then(steps.anything, n=value)
        assert node.compile().unique_tasks == 2


def test_a_fresh_token_each_time_is_refused(src):
    with pytest.raises(PipelineError, match="tokenizes differently each time.*__dask_tokenize__"):
        src.then(steps.add, n=FreshToken())


def test_a_node_as_a_parameter_points_to_combine(src):
    with pytest.raises(PipelineError, match=r"parameter 'n' of add is a pipeline node.*combine\(add, n=node"):
        src.then(steps.add, n=src)


def test_an_unpicklable_parameter_is_refused_before_a_cluster_starts(src, no_cluster, log_dir):
    node = Pipeline("bad").source(steps.source, log=log_dir).explore("a", grid(steps.anything, n=[1, StableButUnpicklable()]))
    with pytest.raises(PipelineError, match=r"step 'anything'.*parameter 'n' \(StableButUnpicklable\) cannot be pickled"):
        node.run(progress=False, quiet=True)
    assert steps.executions(log_dir) == []


def test_compile_refuses_what_is_not_a_pipeline():
    with pytest.raises(PipelineError, match="expected a pipeline node"):
        graph.compile(3)


# ---- run options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, pattern, error",
    [
        ((), {"workers": 0}, "workers must be a whole number >= 1", PipelineError),
        ((), {"workers": 1.5}, "workers must be a whole number >= 1", PipelineError),
        ((), {"threads_per_worker": 0}, "threads_per_worker must be", PipelineError),
        (("localhost",), {}, "'localhost' is not a scheduler address", PipelineError),
        (("tcp://127.0.0.1",), {}, "is not a scheduler address", PipelineError),
        ((), {"wokers": 2}, r"unknown option\(s\) 'wokers'; options: workers", TypeError),
        ((), {"store": 3}, "store: store must be a directory path", PipelineError),
    ],
)
def test_bad_run_options_are_refused_before_a_cluster_starts(src, no_cluster, args, kwargs, pattern, error):
    node = src.explore("a", grid(steps.add, n=[1, 2]))
    with pytest.raises(error, match=pattern):
        node.run(*args, **kwargs)


# ---- huge grids ------------------------------------------------------------------------------------------


def test_a_million_branch_grid_is_refused_without_being_built(src, monkeypatch):
    import pipelines.alternatives as alternatives

    monkeypatch.setattr(alternatives.Grid, "points", lambda self, where: pytest.fail("the grid was built"))
    with pytest.raises(PipelineError, match=r"would make 1,000,000 branches.*limit of 100,000.*QUIVER_BRANCH_LIMIT=1000000"):
        src.explore("big", grid(steps.mul, n=list(range(1000)), log=list(range(1000))))


def test_the_limit_counts_branches_flowing_in(src):
    wide = src.explore("a", grid(steps.add, n=list(range(400))))
    with pytest.raises(PipelineError, match=r"120,000 branches \(400 flowing in x 300 alternatives\)"):
        wide.explore("b", grid(steps.mul, n=list(range(300))))


def test_the_limit_can_be_raised_or_lifted(src, monkeypatch):
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", "10")
    src.explore("a", grid(steps.add, n=list(range(10))))
    with pytest.raises(PipelineError, match="above the limit of 10"):
        src.explore("a", grid(steps.add, n=list(range(11))))
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", "none")
    src.explore("a", grid(steps.add, n=list(range(11))))
    monkeypatch.setenv("QUIVER_BRANCH_LIMIT", "lots")
    with pytest.raises(ValueError, match="QUIVER_BRANCH_LIMIT must be a whole number"):
        src.explore("a", grid(steps.add, n=[1]))


# ---- what steps hand to a choose, at run time --------------------------------------------------------------


def test_outputs_a_choose_cannot_read_fail_their_branch_only(client, src):
    outputs = {
        "list": [1],
        "none": None,
        "text": "x",
        "missing": {"y": 1},
        "not_number": {"x": "abc"},
        "complex": {"x": 1j},
        "nan": {"x": float("nan")},
        "inf": {"x": float("inf")},
        "five": {"x": 5},
    }
    node = src.explore("out", **{name: _returning(value) for name, value in outputs.items()}).choose("x", k=3)
    # "continue": several branches fail alike here on purpose (the default would stop the run)
    t = node.run(client, progress=False, quiet=True, on_metric_error="continue").table.set_index("out")
    errors = {
        "list": "must be a mapping.*returned list",
        "none": "must be a mapping.*returned NoneType",
        "text": "must be a mapping.*returned str",
        "missing": r"has no key 'x' \(keys: \['y'\]\)",
        "not_number": "metric 'x' must be a real number, got str 'abc'",
        "complex": "metric 'x' must be a real number, got complex",
    }
    for name, pattern in errors.items():
        assert t.loc[name, "status"] == "failed", name
        assert re.search(pattern, t.loc[name, "error"]), (name, t.loc[name, "error"])
        assert "choose('x')" in t.loc[name, "failed_step"]
    assert t.loc["nan", "status"] == "ok" and not t.loc["nan", "chosen"]  # NaN is never kept, even with k=3
    assert list(t.index[t["chosen"]]) == ["inf", "five"]


def _returning(value):
    import functools

    return functools.partial(steps.returns, what=value)


def test_nan_never_meets_a_threshold_and_all_nan_keeps_nothing(client, src):
    node = src.explore("a", grid(steps.add, n=[1, 2]))
    kept = node.choose(lambda v: float("nan"), threshold=-math.inf).run(client, progress=False, quiet=True)
    assert kept.values == [] and not kept.table["chosen"].any()
    best = node.choose(lambda v: float("nan")).run(client, progress=False, quiet=True)
    assert best.value is None and (best.table["status"] == "ok").all() and not best.table["chosen"].any()


def test_every_branch_failing_in_the_metric_raises_with_the_table(client, src):
    node = src.explore("a", grid(steps.add, n=[1, 2])).choose("nope")
    with pytest.raises(RunError, match=r"every branch failed \(2 of 2\).*has no key 'nope'") as info:
        node.run(client, progress=False, quiet=True, on_metric_error="continue")
    assert (info.value.table["status"] == "failed").all()


def test_the_same_metric_mistake_stops_the_run_at_once_naming_cause_and_fix(client, src):
    """Issue 13: the first two branches at a choose failing alike end the run with one line,
    instead of computing every branch (the others are cancelled)."""
    node = src.explore("a", grid(steps.sleep_then, seconds=[0.0, 0.01] + [5.0 + i / 10 for i in range(6)])).choose("nope")
    with pytest.raises(RunError) as info:
        node.run(client, progress=False, quiet=True)
    message = str(info.value)
    assert "\n" not in message
    assert "the first 2 branches that reached choose('nope') failed for the same reason" in message
    assert "has no key 'nope'" in message and "on_metric_error='continue'" in message and "--keep-going" in message
    t = info.value.table
    assert (t["status"] == "failed").sum() == 2 and (t["status"] == "cancelled").sum() == 6


def test_on_metric_error_is_checked_before_a_cluster_starts(src):
    with pytest.raises(PipelineError, match="on_metric_error must be 'stop'.*or 'continue'.*not 'ignore'"):
        src.explore("a", grid(steps.add, n=[1, 2])).choose("x").run(on_metric_error="ignore")


@pytest.mark.slow
def test_cli_stops_on_the_same_metric_mistake_unless_keep_going(client, tmp_path, capsys):
    f = tmp_path / "nope.py"
    f.write_text(
        "from pipelines import Pipeline, grid\n"
        "from tests import steps\n"
        "output = Pipeline('p').source(steps.source).explore('a', grid(steps.add, n=[1, 2, 3])).choose('nope')\n"
    )
    address = client.scheduler.address
    code, err = cli(["run", str(f), "--scheduler", address, "--no-progress"], capsys)
    assert code == 1 and "failed for the same reason" in err and "--keep-going" in err
    code, err = cli(["run", str(f), "--scheduler", address, "--no-progress", "--keep-going"], capsys)
    assert code == 1 and "every branch failed (3 of 3)" in err


# ---- the command line ----------------------------------------------------------------------------------------


@pytest.fixture
def marked_file(tmp_path):
    """A pipeline file that leaves a marker when it is loaded, to prove bad arguments load nothing."""
    marker = tmp_path / "loaded"
    f = tmp_path / "pipe.py"
    f.write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('yes')\n"
        "from pipelines import Pipeline, grid\n"
        "from tests import steps\n"
        "output = Pipeline('p').source(steps.source).explore('a', grid(steps.add, n=[1, 2])).choose('x')\n"
    )
    return f, marker


def cli(argv, capsys):
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


bad_argv = st.sampled_from(
    [
        (["--workers", "0"], "must be at least 1"),
        (["--workers", "two"], "not a whole number"),
        (["--threads-per-worker", "-1"], "must be at least 1"),
        (["--memory-limit", "lots"], "not a size"),
        (["--scheduler", "localhost"], "not a scheduler address"),
        (["--scheduler", "tcp://127.0.0.1:8786", "--workers", "2"], "--workers applies to the embedded cluster only"),
        (["--scheduler", "tcp://127.0.0.1:8786", "--memory-limit", "2GiB"], "configure the embedded cluster only"),
        (["--scheduler", "tcp://127.0.0.1:8786", "--threads-per-worker", "2"], "configure the embedded cluster only"),
        (["--branch-limit", "many"], "not a whole number"),
        (["--json", "/no/such/dir/out.json"], "no directory"),
        (["--store", "__FILE__"], "exists and is not a directory"),
        (["--order", "random"], "invalid choice"),
        (["--frobnicate"], "unrecognized arguments"),
        (["--node"], "expected one argument"),
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_argv)
def test_bad_cli_arguments_exit_2_and_load_nothing(marked_file, capsys, case):
    f, marker = marked_file
    argv, message = case
    argv = [str(f) if a == "__FILE__" else a for a in argv]
    code, err = cli(["run", str(f), *argv], capsys)
    assert code == 2, err
    assert message in err and "usage: quiver" in err
    assert not marker.exists()


def test_cli_without_a_command_or_file_exits_2(capsys):
    assert cli([], capsys)[0] == 2
    assert cli(["run"], capsys)[0] == 2
    assert cli(["explore", "x.py"], capsys)[0] == 2


@pytest.mark.slow
def test_cli_unreachable_scheduler_is_one_line(tmp_path):
    f = tmp_path / "pipe.py"
    f.write_text(
        "from pipelines import Pipeline, grid\nfrom tests import steps\n"
        "output = Pipeline('p').source(steps.source).explore('a', grid(steps.add, n=[1, 2])).choose('x')\n"
    )
    env = dict(os.environ, DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="1s", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", str(f), "--scheduler", "tcp://127.0.0.1:9", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("quiver: error: OSError: Timed out trying to connect to tcp://127.0.0.1:9"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "ucxx://node7:8786", "[::1]:8786", "[fe80::1%eth0]:8786", "inproc://10.0.0.1/77/3"]
)
def test_valid_scheduler_addresses_are_accepted(address):
    from pipelines.preflight import ADDRESS

    assert ADDRESS.match(address)
