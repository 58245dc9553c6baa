"""Run options have one owner (graph.run.options.check_options): Node.run, execute and the CLI call it."""

from __future__ import annotations

import pytest

from graph.errors import PipelineError
from graph.run.options import ORDERS, RunOptions, check_options


def test_defaults_are_the_run_defaults():
    opts = check_options()
    assert opts == RunOptions(stall_seconds=60.0)
    assert opts.order in ORDERS and opts.store is None


@pytest.mark.parametrize(
    "options, names",
    [
        ({"order": "random"}, ["order", "'depth-first'", "'random'"]),
        ({"on_metric_error": "ignore"}, ["on_metric_error", "'continue'", "'ignore'"]),
        ({"pack": "yes"}, ["pack must be True"]),
        ({"sample_sizes": 1}, ["sample_sizes must be True or False"]),
        ({"stall_timeout": -1}, ["stall_timeout must be seconds"]),
        ({"stall_timeout": "10"}, ["stall_timeout must be seconds"]),
        ({"memory_budget": "lots"}, ["memory budget 'lots' is not a size", "2 GiB"]),
        ({"memory_budget": 0}, ["memory budget must be positive"]),
        ({"memory_budget": "1 GiB", "disk_bandwidth": "fast"}, ["disk_bandwidth 'fast' is not a size"]),
        ({"sample_sizes": True}, ["sample_sizes plans memory", "needs memory_budget"]),
    ],
)
def test_a_bad_option_is_named_with_how_to_fix_it(options, names):
    with pytest.raises(PipelineError) as info:
        check_options(**options)
    for text in names:
        assert text in str(info.value)


def test_the_cli_names_its_flags():
    spelled = {"stall_timeout": "--stall-timeout", "memory_budget": "--memory-budget", "sample_sizes": "--sample-sizes"}
    with pytest.raises(PipelineError, match="^--stall-timeout must be seconds"):
        check_options(stall_timeout=-2, spelled=spelled)
    with pytest.raises(PipelineError, match="^--sample-sizes plans memory .* needs --memory-budget too"):
        check_options(sample_sizes=True, spelled=spelled)
    with pytest.raises(PipelineError, match="^--memory-budget 'x' is not a size"):
        check_options(memory_budget="x", spelled=spelled)


def test_good_options_come_back_in_the_form_the_run_uses(tmp_path):
    opts = check_options(order="dask", on_metric_error="continue", stall_timeout=0, pack=False,
                         memory_budget="2 KiB", disk_bandwidth=1000, sample_sizes=True, store=tmp_path / "s")
    assert (opts.order, opts.on_metric_error, opts.stall_seconds, opts.pack) == ("dask", "continue", None, False)
    assert (opts.memory_budget_bytes, opts.disk_bandwidth_bytes, opts.sample_sizes) == (2048, 1000, True)
    assert opts.store.path == str(tmp_path / "s") and (tmp_path / "s").is_dir()
    assert check_options(store=opts.store).store.path == opts.store.path  # a ResultStore passes through


def test_a_store_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(PipelineError, match="store: .* exists and is not a directory"):
        check_options(store=f)


def test_execute_checks_its_options_before_asking_the_cluster_anything():
    from graph.run.executor import execute
    from pipelines import Pipeline
    from tests import steps

    compiled = Pipeline("p").source(steps.source).compile()
    with pytest.raises(PipelineError, match="order must be"):
        execute(compiled, None, order="breadth-first")  # no client needed: refused first
    with pytest.raises(PipelineError, match="sample_sizes plans memory"):
        execute(compiled, None, sample_sizes=True)
