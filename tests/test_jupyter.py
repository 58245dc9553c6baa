"""A Result in Jupyter: ``_repr_html_`` on a real run shows the chosen path, the key stats,
the dashboard link of a live cluster, and the table ranked by the choose's metric."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from pipelines import Pipeline, grid
from tests import steps

pytestmark = pytest.mark.timeout(120)


class _Balanced(HTMLParser):
    """Fails on a closing tag that does not match the open one (void tags aside)."""

    VOID = {"br", "img", "meta", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def _balanced(html: str) -> None:
    p = _Balanced()
    p.feed(html)
    assert p.stack == [], f"unclosed tags {p.stack}"


def test_result_html_on_a_real_run(client):
    node = (
        Pipeline("jupyter").source(steps.source, seed=1)
        .explore("op", grid(steps.add, n=[1, 2, 3]), grid(steps.mul, n=[5, 7]))
        .choose("x", mode="min")
    )
    r = node.run(client, progress=False, quiet=True)
    html = r._repr_html_()
    _balanced(html)
    assert "Quiver result</b>: 5 branches" in html
    assert "branch 0: op=add(n=1)" in html and "<b>x = 2</b>" in html  # the chosen path and its metric
    stats = r.stats
    assert f"tasks: {stats['executed_tasks']} executed of {stats['unique_tasks']} unique ({stats['naive_tasks']}" in html
    # the dashboard of the live cluster, on Quiver's exploration page
    assert r.dashboard_link == client.dashboard_link.rsplit("/", 1)[0] + "/quiver-exploration"
    assert f'href="{r.dashboard_link}"' in html
    # the table is ranked by the metric, best (lowest) first: 1+1=2, 1+2=3, 1+3=4, 1*5=5, 1*7=7
    rows = [html.index(f"<th>{i}</th>") for i in range(5)]
    assert rows == sorted(rows)
    assert "traceback" not in html  # long columns stay in result.table
    assert "<pre" not in html and "&lt;Result" not in html  # not the text repr


def test_result_html_without_a_cluster_long_table_and_failures():
    import pandas as pd

    from pipelines import Result
    from pipelines.notebook import MAX_ROWS

    n = MAX_ROWS + 5
    t = pd.DataFrame({
        "m": ["f"] * n, "m.k": list(range(n)), "acc": [i / n for i in range(n)],
        "status": ["ok"] * (n - 2) + ["failed", "ok"], "seconds": [0.1] * n,
        "chosen": [False] * (n - 1) + [True], "error": [None] * (n - 2) + ["ValueError: <bad>", None],
        "traceback": [None] * (n - 2) + ["Traceback ...", None],
    })
    r = Result(table=t, value=None, values=[], stats={"wall_seconds": 1.25, "peak_memory_bytes": 3 * 2**20})
    html = r._repr_html_()
    _balanced(html)
    assert f"branch {n - 1}: m=f(k={n - 1})" in html
    assert "ok 24, failed 1" in html and "1.2 s" in html and "peak memory 3 MiB" in html
    assert "5 more rows" in html and f"has all {n}" in html
    assert "ValueError: &lt;bad&gt;" in html and "<bad>" not in html  # the error shown, escaped
