"""Run options have one owner (graph.run.options.RunOptions): each one's name, default and check is
written there once; graph.execute, Node.run, the driver, a search and the CLI take them from it."""

from __future__ import annotations

import pytest

from graph.errors import PipelineError
from graph.run.options import ORDERS, RunOptions, check_options, run_options, search_options


def test_defaults_are_the_run_defaults():
    opts = check_options()
    assert opts == RunOptions() and opts.stall_seconds == 60.0
    assert opts.order in ORDERS and opts.store is None
    assert {k: getattr(opts, k) for k in run_options()} == run_options()


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
        ({"workers": 0}, ["workers must be a whole number >= 1", "or None for one per core"]),
        ({"threads_per_worker": True}, ["threads_per_worker must be a whole number >= 1"]),
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
    assert (opts.memory_budget, opts.disk_bandwidth, opts.sample_sizes) == ("2 KiB", 1000, True)
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


# ---- one owner: the names and defaults every entry point takes come from RunOptions ------------------


def _own_parameters(fn) -> set[str]:
    """The parameters ``fn`` itself spells out (its code's), not those its shown signature lists."""
    code = fn.__code__
    return set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])


def test_no_entry_point_spells_an_option_again():
    import graph
    from graph.run.adaptive import run_search
    from graph.run.executor import execute
    from graph.run.session import run_checked, run_compiled
    from pipelines.runner import run_node, run_search_node

    for fn in (run_compiled, run_checked, execute, run_search, run_node, run_search_node):
        assert not _own_parameters(fn) & set(run_options()), fn.__qualname__
    assert graph.execute is run_compiled


def test_what_graph_execute_and_the_driver_show_is_the_owners():
    import inspect

    import graph
    from graph.run.executor import execute

    for fn in (graph.execute, execute):
        shown = {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert {n: shown[n] for n in run_options()} == run_options()


def test_a_searchs_options_are_the_owners_subset_with_the_same_defaults():
    import pipelines.runner

    searched = search_options()
    assert list(searched) == ["workers", "threads_per_worker", "memory_limit", "progress", "quiet",
                              "raise_if_all_failed", "stall_timeout"]
    assert all(run_options()[k] == v for k, v in searched.items())
    assert pipelines.runner.run_options() == {**run_options(), "tracking": None}


def test_the_cli_flags_defaults_are_the_owners():
    from pipelines.cli import build_parser

    args = build_parser().parse_args(["run", "f.py"])
    for option in ("workers", "threads_per_worker", "memory_limit", "memory_budget", "sample_sizes", "order",
                   "stall_timeout", "store"):
        assert getattr(args, option) == run_options()[option], option


def test_the_sklearn_drop_ins_defaults_are_the_owners():
    """scikit-learn wants an estimator's parameters spelled in its ``__init__``: they must agree."""
    pytest.importorskip("sklearn")
    import inspect

    from pipelines.sklearn import search

    owner = {**run_options(), "tracking": None}
    for cls in (search.GridSearchCV, search.RandomizedSearchCV, search.HalvingGridSearchCV,
                search.HalvingRandomSearchCV):
        params = inspect.signature(cls.__init__).parameters
        for option in ("memory_budget", "store", "progress", "tracking"):
            assert params[option].default == owner[option], (cls.__name__, option)


def test_an_unknown_option_gets_one_message_wherever_it_is_given():
    import graph
    from graph.run.executor import execute
    from pipelines import Pipeline
    from tests import steps

    compiled = Pipeline("p").source(steps.source).compile()
    for call, caller in ((lambda: graph.execute(compiled, wokers=2), "graph.execute()"),
                         (lambda: execute(compiled, None, wokers=2), "execute()"),
                         (lambda: check_options(wokers=2), "the run")):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == f"{caller}: unknown option(s) 'wokers'; options: {', '.join(run_options())}"
