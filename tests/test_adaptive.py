"""An adaptive search on a real LocalCluster (issue 47): a sampler's proposals that repeat a
prefix run it once (executed = unique), a failed trial does not stop the search, a pruned one is
told PRUNED, a study in an SQLite storage resumed by a second run continues from its trials, and
the input every trial reads is copied to the other worker while the first trials start side by
side. Tests assert behaviour, never elapsed time."""

from __future__ import annotations

import collections
import functools

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402

import graph  # noqa: E402
from dask.config import set as graph_config  # noqa: E402
from pipelines import Pipeline, PipelineError, space  # noqa: E402
from tests import search_steps as s  # noqa: E402
from tests.steps import executions  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_proposals_that_repeat_a_prefix_run_it_once(client, log_dir):
    prep = Pipeline("adaptive").source(s.load, log=log_dir).explore(
        "prep", functools.partial(s.double, log=log_dir), functools.partial(s.negate, log=log_dir))
    node = prep.explore("model", space(s.fit, a=FloatDistribution(-3, 3), log=log_dir)).search(
        "score", n_trials=12, sampler=optuna.samplers.RandomSampler(seed=0))
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    assert len(t) == 12 and set(t["state"]) == {"COMPLETE"}
    assert list(t["trial"]) == list(range(12))
    ran = collections.Counter(executions(log_dir))
    assert ran["load"] == 1  # the source, shared by every trial
    assert ran["double"] + ran["negate"] == t["prep"].nunique() <= 2  # each prefix once
    assert all(n == 1 for n in ran.values())  # nothing ran twice
    st = result.stats
    assert st["executed_tasks"] == st["unique_tasks"] == sum(ran.values())
    assert st["metric_tasks"] == 0  # each last step sent its metric itself: no read task ran
    assert st["naive_tasks"] == 36 and st["prefix_tasks_saved"] == 24 - 1 - t["prep"].nunique()
    best = t.loc[t["value"].idxmax()]
    assert result.best_trial == best["trial"] and result.value["score"] == best["value"]
    assert result.best_params == result.study.best_trial.params
    assert set(result.best_params) == {"prep", "model.a"}


def test_a_failed_trial_is_told_fail_and_the_search_goes_on(client, log_dir):
    node = Pipeline("fails").source(s.load, log=log_dir).explore(
        "model", space(s.fragile, a=FloatDistribution(0, 1), log=log_dir)).search(
        "score", n_trials=10, sampler=optuna.samplers.RandomSampler(seed=1), in_flight=2)
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    assert len(t) == 10 and {"COMPLETE", "FAIL"} == set(t["state"])
    failed = t[t["state"] == "FAIL"]
    assert (failed["model.a"] > 0.5).all() and failed["error"].str.contains("too large").all()
    assert failed["traceback"].str.contains("fragile").all()
    states = {tr.number: tr.state.name for tr in result.study.trials}
    assert states == dict(zip(t["trial"], t["state"]))
    assert result.value["score"] == t[t["state"] == "COMPLETE"]["value"].max() <= 0.5


def test_a_step_raising_trial_pruned_is_told_pruned(client):
    node = Pipeline("prunes").source(s.load).explore("model", space(s.pruned, a=FloatDistribution(0, 1))).search(
        "score", n_trials=8, sampler=optuna.samplers.RandomSampler(seed=2))
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    assert set(t["state"]) == {"COMPLETE", "PRUNED"}
    assert (t[t["state"] == "PRUNED"]["model.a"] > 0.5).all()
    assert result.stats["pruned"] == sum(tr.state.name == "PRUNED" for tr in result.study.trials)


def test_a_study_in_sqlite_resumed_by_a_second_run_continues_from_its_trials(client, tmp_path):
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    node_of = lambda study: Pipeline("resume").source(s.load).explore(  # noqa: E731
        "model", space(s.width, n=IntDistribution(1, 50))).search("score", n_trials=5, study=study)
    first = optuna.create_study(storage=storage, study_name="q", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    node_of(first).run(client, progress=False, quiet=True)
    again = optuna.load_study(storage=storage, study_name="q", sampler=optuna.samplers.RandomSampler(seed=3))
    result = node_of(again).run(client, progress=False, quiet=True)
    assert list(result.table["trial"]) == [5, 6, 7, 8, 9]  # numbered after the first run's
    trials = optuna.load_study(storage=storage, study_name="q").trials
    assert len(trials) == 10 and all(tr.state.name == "COMPLETE" for tr in trials)
    assert result.stats["trials"] == 5


def test_a_categorical_only_space_repeating_a_configuration_runs_it_once(client, log_dir):
    """The same configuration proposed again is told its known value: nothing runs twice."""
    node = Pipeline("repeat").source(s.load, log=log_dir).explore(
        "model", space(s.width, n=CategoricalDistribution([1, 2]), log=log_dir)).search(
        "score", n_trials=8, sampler=optuna.samplers.RandomSampler(seed=0), in_flight=1)
    result = node.run(client, progress=False, quiet=True)
    ran = collections.Counter(executions(log_dir))
    assert len(result.table) == 8 and set(result.table["state"]) == {"COMPLETE"}
    assert all(n == 1 for n in ran.values()) and sum(ran.values()) <= 3
    assert result.stats["executed_tasks"] == result.stats["unique_tasks"]


# ---- refused while building (no cluster) ---------------------------------------------------------------
F = FloatDistribution(0, 1)


def test_bad_searches_are_refused_while_building_with_the_fix():
    src = Pipeline("bad").source(s.load)
    cases = [
        (lambda: src.then(s.fit, a=F), "space("),
        (lambda: src.explore("m", space(s.fit, a=F)).choose("score"), ".search("),
        (lambda: src.explore("m", space(s.fit, a=[0.1, 0.2])), "CategoricalDistribution"),
        (lambda: src.explore("m", space(s.fit, a=0.1)), "no distribution"),
        (lambda: src.explore("m", space(s.fit, b=F)), "cannot be called"),
        (lambda: src.then(s.fit, a=1).search("score"), "nothing to search"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score", n_trials=0), "n_trials"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score", in_flight=0), "in_flight"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score", sampler="tpe"), "Optuna sampler"),
        (lambda: src.explore("m", space(s.fit, a=F)).search(
            "score", sampler=optuna.samplers.RandomSampler(), study=optuna.create_study()), "not both"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score", mode="max", study=optuna.create_study()),
         "direction"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score", pruner="median"), "Optuna pruner"),
        (lambda: src.explore("m", space(s.fit, a=F)).search(
            "score", pruner=optuna.pruners.MedianPruner(), study=optuna.create_study(direction="maximize")),
         "a pruner or a study, not both"),
        (lambda: src.explore("m", space(s.fit, a=F)).search("score").then(s.double), "end of its pipeline"),
        (lambda: src.explore("p", s.double, s.negate).choose("x").explore("m", space(s.fit, a=F)).search("score"),
         "choose"),
    ]
    for build, words in cases:
        with pytest.raises(PipelineError) as info:
            build()
        assert words in str(info.value), (words, str(info.value))


def test_a_space_is_refused_by_a_listed_compile_and_a_search_node_by_graph_compile():
    node = Pipeline("c").source(s.load).explore("m", space(s.fit, a=F))
    with pytest.raises(PipelineError, match="only a search proposes"):
        graph.compile(node)
    with pytest.raises(PipelineError, match="one proposal at a time"):
        graph.compile(node.search("score"))


def test_options_a_search_does_not_take_are_refused_by_name():
    node = Pipeline("o").source(s.load).explore("m", space(s.fit, a=F)).search("score", n_trials=1)
    with pytest.raises(TypeError, match="memory_budget"):
        node.run(memory_budget="1 GiB")
    with pytest.raises(TypeError, match="unknown option"):
        node.run(colour="red")


def test_a_search_refuses_bad_options_as_a_run_does_before_a_cluster_starts(monkeypatch):
    """One owner (graph.run.options): an unknown option, or a bad value of one a search takes, gets
    the run's message (a search lists the options it takes), before any cluster starts."""
    import graph.cluster.connect
    from graph.run.options import search_options

    monkeypatch.setattr(graph.cluster.connect, "connect", lambda *a, **k: pytest.fail("a cluster was started"))
    search = Pipeline("o").source(s.load).explore("m", space(s.fit, a=F)).search("score", n_trials=1)
    run = Pipeline("o").source(s.load).explore("m", s.double)
    for node, listed in ((search, search_options()), (run, None)):
        with pytest.raises(TypeError) as info:
            node.run(wokers=2)
        assert str(info.value).startswith("Node.run(): unknown option(s) 'wokers'; options: workers, ")
        if listed is not None:
            assert str(info.value).endswith(f"options: {', '.join(listed)}")
    for bad, words in (({"stall_timeout": -1}, "stall_timeout must be seconds"),
                       ({"workers": 0}, "workers must be a whole number >= 1")):
        for node in (search, run):
            with pytest.raises(PipelineError, match=words):
                node.run(**bad)
    with pytest.raises(TypeError, match="a search does not take 'order' yet"):
        search.run(order="dask")
    with pytest.raises(PipelineError, match="'localhost' is not a scheduler address"):
        search.run("localhost")


def test_a_search_whose_workers_are_gone_is_stopped_by_the_watchdog_with_its_trials_told():
    """The run's watchdog (graph.run.watchdog) watches a search too: no worker left, the search
    ends with a RunError naming why, and its open trials are told FAIL (none left RUNNING)."""
    import threading

    from distributed import Client, LocalCluster

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    node = Pipeline("gone").source(s.load).explore("model", space(s.sleepy, a=F)).search(
        "score", n_trials=50, study=study, in_flight=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        threading.Timer(2.0, lambda: cluster.scale(0)).start()
        with pytest.raises(graph.RunError, match="worker"):
            node.run(c, progress=False, quiet=True, stall_timeout=3)
    assert 1 <= len(study.trials) < 50
    assert all(tr.state.name in ("COMPLETE", "FAIL") for tr in study.trials)


@pytest.mark.parametrize("make", [
    lambda: optuna.samplers.TPESampler(seed=0),
    lambda: optuna.samplers.RandomSampler(seed=0),
    lambda: pytest.importorskip("cmaes") and optuna.samplers.CmaEsSampler(seed=0),
    lambda: pytest.importorskip("torch") and pytest.importorskip("scipy") and optuna.samplers.GPSampler(seed=0),
    lambda: optuna.samplers.QMCSampler(seed=0),
    lambda: optuna.samplers.GridSampler({"prep": ["double", "negate"], "model": ["fit", "deep"],
                                         "model.a": [-1.0, 0.0, 1.0], "model.depth": [2, 3]}, seed=0),
], ids=["tpe", "random", "cmaes", "gp", "qmc", "grid"])
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_each_sampler_answers_the_space_through_ask_and_tell(make):
    """No cluster: the space's questions (an explore's choice, conditional distributions) asked of
    a real study with each sampler, each answer compiled to the same keys a second time."""
    from graph.compiling.trials import SearchSpace, compile_proposal

    node = Pipeline("samplers").source(s.load).explore("prep", s.double, s.negate).explore(
        "model", space(s.fit, a=FloatDistribution(-1.0, 1.0)), space(s.deep, depth=IntDistribution(2, 3))).search(
        "score", n_trials=6)
    sp = SearchSpace(node.spec)
    assert set(sp.names()) == {"prep", "model", "model.a", "model.depth"}
    study = optuna.create_study(direction="maximize", sampler=make())
    for _ in range(6):
        trial = study.ask()
        proposal = sp.suggest(trial)
        first, again = compile_proposal(proposal), compile_proposal(sp.suggest(optuna.trial.FixedTrial(trial.params)))
        assert first.path == again.path and first.metric == again.metric
        label, params = proposal.choices["model"]
        assert set(params) == ({"a"} if label == "fit" else {"depth"})
        study.tell(trial, float(len(trial.params)))
    assert all(tr.state.name == "COMPLETE" for tr in study.trials)


def test_the_names_a_sampler_sees():
    """An explore is a categorical named after it (a grid's points by label and values); a
    space's parameter is "<explore>.<param>", or "<explore>.<label>.<param>" when two
    alternatives of the explore share its name."""
    from graph.compiling.trials import SearchSpace
    from pipelines import grid

    node = (Pipeline("names").source(s.load)
            .explore("prep", grid(s.width, n=[1, 2]))
            .then(s.double)
            .explore("model", space(s.fit, a=F), space(s.fragile, a=F), space(s.deep, depth=IntDistribution(1, 4))))
    names = SearchSpace(node.search("score").spec).names()
    assert names["prep"] == ("width(n=1)", "width(n=2)")
    assert names["model"] == ("fit", "fragile", "deep")
    assert set(names) == {"prep", "model", "model.fit.a", "model.fragile.a", "model.depth"}


def test_plain_names_are_the_parameters_own_and_must_not_repeat():
    """``SearchSpec(param_names="plain")`` (pipelines.sklearn.OptunaSearchCV's ``clf__C``): a
    space's parameter is asked by its own name; two questions of one name are refused."""
    import dataclasses

    from graph.compiling.trials import SearchSpace

    node = (Pipeline("plain").source(s.load).explore("prep", space(s.width, n=IntDistribution(1, 2)))
            .explore("model", space(s.deep, depth=IntDistribution(1, 4))))
    spec = dataclasses.replace(node.search("score").spec, param_names="plain")
    assert set(SearchSpace(spec).names()) == {"n", "depth"}
    clash = node.explore("again", space(s.width, n=IntDistribution(3, 4)))
    with pytest.raises(graph.PipelineError, match="asks the sampler 'n' twice.*'prep' and 'again'"):
        SearchSpace(dataclasses.replace(clash.search("score").spec, param_names="plain"))


def test_a_generator_step_can_end_a_search_and_its_return_value_is_told(client):
    node = Pipeline("gen").source(s.load).explore("train", space(s.epochs, lr=FloatDistribution(0.0, 1.0))).search(
        "score", n_trials=4, sampler=optuna.samplers.RandomSampler(seed=0))
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    assert set(t["state"]) == {"COMPLETE"}
    assert all(abs(v - 3 * lr) < 1e-9 for v, lr in zip(t["value"], t["train.lr"]))


def test_a_pruner_stops_a_generator_steps_trials_mid_training(client, log_dir):
    epochs = 8
    node = Pipeline("pruned-curves").source(s.load).explore(
        "train", space(s.curve, rate=FloatDistribution(0.0, 1.0), n=epochs, log=log_dir, seconds=0.2)).search(
        "score", n_trials=8, sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))
    result = node.run(client, progress=False, quiet=True)
    t = result.table
    ran = collections.Counter(executions(log_dir))
    assert len(t) == 8 and set(t["state"]) <= {"COMPLETE", "PRUNED"}
    pruned, complete = t[t["state"] == "PRUNED"], t[t["state"] == "COMPLETE"]
    assert len(pruned) >= 1 and len(complete) >= 2  # the 2 startup trials are never pruned

    def executed(rate):
        return sum(1 for k in ran if k.startswith(f"curve({rate!r})@"))

    for _, row in complete.iterrows():
        assert executed(row["train.rate"]) == epochs
        assert row["value"] == pytest.approx(row["train.rate"] * (1 - 0.5 ** epochs))
    for _, row in pruned.iterrows():
        done = executed(row["train.rate"])
        assert 2 <= done < epochs  # stopped mid-training, after the warm-up step (step 0: the first report)
        reported = [row["train.rate"] * (1 - 0.5 ** e) for e in range(2, done + 1)]
        assert any(row["value"] == pytest.approx(v) for v in reported)  # its last reported value is kept
    assert all(n == 1 for n in ran.values())  # no epoch ran twice
    frozen = {tr.number: tr for tr in result.study.trials}
    assert {n: tr.state.name for n, tr in frozen.items()} == dict(zip(t["trial"], t["state"]))
    for _, row in pruned.iterrows():
        tr = frozen[row["trial"]]
        assert tr.value == pytest.approx(row["value"])
        assert tr.intermediate_values[max(tr.intermediate_values)] == pytest.approx(row["value"])
    st = result.stats
    assert st["trials"] == 8 and st["pruned"] == len(pruned) == st["stopped_steps"]
    assert st["executed_tasks"] + st["stopped_steps"] == st["unique_tasks"]  # a stopped step ends unfinished


def test_the_keys_every_trial_reads_are_the_source_and_the_steps_before_the_first_choice():
    from graph.compiling.trials import SearchSpace, common_keys

    fixed = Pipeline("c").source(s.load).then(s.double).explore("prep", s.negate)  # one alternative: no question
    node = fixed.explore("model", space(s.fit, a=FloatDistribution(0, 1))).search("score", n_trials=3)
    assert [k.split("-")[0] for k in common_keys(SearchSpace(node.spec))] == ["load", "double", "negate"]
    chosen = Pipeline("c").source(s.load).explore("prep", s.double, s.negate).explore(
        "model", space(s.fit, a=FloatDistribution(0, 1))).search("score", n_trials=3)
    assert [k.split("-")[0] for k in common_keys(SearchSpace(chosen.spec))] == ["load"]


def test_the_input_every_trial_reads_is_copied_and_the_first_two_trials_start_side_by_side(client):
    # the source is computed on one worker; Dask alone places every trial reading it there (the
    # only holder) until work stealing moves one: the search copies it to the other worker the
    # moment it exists and starts the second trial there
    node = Pipeline("side").source(s.load).explore("model", space(s.timed, a=FloatDistribution(0, 1))).search(
        "score", n_trials=4, sampler=optuna.samplers.RandomSampler(seed=0), in_flight=2)
    result = node.run(client, progress=False, quiet=True)
    st, t = result.stats, result.table.sort_values("trial")
    (source,) = st["shared_copies"]
    assert source.startswith("load-") and len(st["shared_copies"][source]) == 1  # the other worker of two
    # (a trial submitted after the copy landed is Dask's to place: spread_tasks may be 0)
    first, second = t.iloc[0], t.iloc[1]
    assert first["pid"] != second["pid"] and second["start"] < first["end"]
    assert st["executed_tasks"] == st["unique_tasks"] == 5  # copied and placed, nothing ran twice
    with graph_config({"quiver.shared-copies": False, "quiver.spread-ready": False}):
        off = node.run(client, progress=False, quiet=True).stats
    assert off["shared_copies"] == {} and off["spread_tasks"] == 0
