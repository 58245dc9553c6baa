"""Issue 45 item 2: one run path. ``graph.execute`` on a compiled pipeline is the run ``Node.run``
makes (graph/run/session.py): the same stats, the same plugins, the same table."""

from __future__ import annotations

import pytest

import graph
from pipelines import Pipeline, grid

pytestmark = pytest.mark.slow  # real clusters


def _load():
    return 3


def _power(x, p):
    return {"v": float(x ** p)}


def _node():
    return Pipeline("path").source(_load).explore("p", grid(_power, p=[1, 2, 3])).choose("v")


def test_a_compiled_pipeline_through_graph_execute_gets_what_node_run_gets(client):
    by_node = _node().run(client, progress=False, quiet=True)
    record = graph.execute(graph.compile(_node()), client, progress=False, quiet=True)
    assert set(record.stats) == set(by_node.stats)
    assert record.values[0] == by_node.value == {"v": 27.0}
    assert list(record.table["status"]) == list(by_node.table["status"])
    # what only the composed run had before: the cluster's share, the time breakdown, the plugins' counts
    for key in ("cluster", "time_breakdown", "spread_tasks", "shared_copies", "step_warnings", "compile_seconds"):
        assert key in record.stats


def test_graph_execute_refuses_a_bad_option_before_anything_runs():
    with pytest.raises(graph.PipelineError, match="order must be 'depth-first'"):
        graph.execute(graph.compile(_node()), order="random")
