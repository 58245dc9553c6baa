"""Reports: ``result.plot(...)`` and ``quiver run ... --report DIR`` write PNGs and one self-contained HTML page."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from pipelines import Pipeline, Result, grid
from tests import steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # slow: matplotlib reports of real runs

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Collects tags, image sources and the id/class of table rows; fails on unbalanced tags."""

    VOID = {"meta", "img", "br", "link", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.images: list[str] = []
        self.rows: dict[str, str] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "tr" and a.get("id"):
            self.rows[a["id"]] = a.get("class", "")
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}> after {self.stack[-3:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    assert page.stack == [], page.stack
    return page


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 2000, path


def test_plot_writes_pngs_and_a_self_contained_html(client, tmp_path):
    src = Pipeline("report").source(steps.source, seed=1)
    a = src.explore("a", grid(steps.add, n=[1, 2, 3]))
    b = a.explore("b", grid(steps.mul, n=[1, 10]), sq=steps.square)
    result = b.choose("x", mode="max").run(client, progress=False, quiet=True)
    written = result.plot(tmp_path / "out")
    # no training history here; memory over time per worker: every run samples it (the dashboard's plugin)
    assert set(written) == {"metrics", "memory", "html"}
    check_png(written["memory"])
    assert written["html"] == tmp_path / "out" / "report.html"
    check_png(written["metrics"])
    page = parse(written["html"])
    # self-contained: the one image is inlined, and it is the same PNG
    assert len(page.images) == len(written) - 1
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert base64.b64decode(page.images[0].split(",", 1)[1]) == written["metrics"].read_bytes()
    html = written["html"].read_text()
    assert not re.search(r'(src|href)="(?!data:)', html)
    # the chosen branch is named and its row highlighted; no other row is
    chosen = int(result.chosen.index[0])
    text = " ".join(page.text)
    assert f"Chosen branch #{chosen}: a=add(n=3), b=mul(n=10) (x = 40)" in text
    assert page.rows[f"branch-{chosen}"] == "chosen"
    assert [r for r, cls in page.rows.items() if cls == "chosen"] == [f"branch-{chosen}"]
    assert len(page.rows) == len(result.table)


def test_training_curves_and_memory_timeline_are_drawn_when_present(tmp_path):
    table = pd.DataFrame(
        {"train": ["train", "train"], "train.lr": [0.05, 0.1], "accuracy": [0.9, 0.95], "status": ["ok", "ok"],
         "seconds": [1.0, 1.0], "chosen": [False, True], "error": [None, None]}
    )
    history = [
        {"epoch": e, "accuracy": 0.8 + 0.05 * e, "test_loss": 1.0 / e, "train_loss": 0.9 / e,
         "samples_per_s": 1000.0 + e, "spread": 0.1 * e}
        for e in (1, 2, 3)
    ]
    timeline = [(0.25 * i, 100e6 + 1e6 * i, 0.0 if i < 5 else 2e6) for i in range(10)]
    result = Result(table=table, value={"accuracy": 0.95, "history": history}, values=[{"accuracy": 0.95, "history": history}],
                    stats={"wall_seconds": 2.5, "memory_timeline": timeline})
    written = result.plot(tmp_path / "run.html", title="Training report")
    assert set(written) == {"metrics", "training", "memory", "html"}
    assert written["training"] == tmp_path / "run-training.png"
    for name in ("metrics", "training", "memory"):
        check_png(written[name])
    page = parse(written["html"])
    assert len(page.images) == 3
    assert "Chosen branch #1: train=train(lr=0.1) (accuracy = 0.95)" in " ".join(page.text)


def test_a_training_run_without_history_says_why_there_is_no_training_figure(tmp_path):
    from types import SimpleNamespace

    table = pd.DataFrame(
        {"train": ["train", "train"], "train.lr": [0.05, 0.1], "accuracy": [0.9, 0.95], "status": ["ok", "ok"],
         "seconds": [1.0, 1.0], "chosen": [False, True], "error": [None, None]}
    )
    trained = SimpleNamespace(graph={"train-1a2b": None, "load-3c4d": None}, chooses=[], explore_names=["train"])
    result = Result(table=table, value={"accuracy": 0.95}, values=[{"accuracy": 0.95}], stats={}, compiled=trained)
    written = result.plot(tmp_path)
    assert "training" not in written
    assert any("no training.png" in n and "'history'" in n for n in written["notes"])
    assert "no training.png" in written["html"].read_text()
    # a run that did not train draws no training figure and says nothing about it
    untrained = SimpleNamespace(graph={"load-3c4d": None}, chooses=[], explore_names=["train"])
    plain = Result(table=table, value={"accuracy": 0.95}, values=[{"accuracy": 0.95}], stats={}, compiled=untrained)
    assert "notes" not in plain.plot(tmp_path / "plain")


def test_memory_timeline_is_optional_and_tolerant():
    from pipelines.report import memory_series

    assert memory_series(None) == ([], {})
    t, s = memory_series({"t": [0, 1], "measured": [5, 6], "planned": [7, 7]})
    assert t == [0.0, 1.0] and s == {"measured": [5.0, 6.0], "planned": [7.0, 7.0]}
    t, s = memory_series([{"seconds": 0, "process": 1}, {"seconds": 1, "process": 2}])
    assert t == [0.0, 1.0] and s == {"process": [1.0, 2.0]}


def test_cli_report_option(client, tmp_path):
    file = tmp_path / "tiny.py"
    file.write_text(textwrap.dedent(
        """
        from pipelines import Pipeline, grid

        def load():
            return 3

        def scale(x, k):
            return {"score": x * k}

        output = Pipeline("tiny").source(load).explore("k", grid(scale, k=[1, 2, 5])).choose("score")
        """
    ))
    out_dir = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", str(file), "--scheduler", client.scheduler.address,
         "--no-progress", "--report", str(out_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"report: {out_dir / 'report.html'}" in proc.stdout
    check_png(out_dir / "metrics.png")
    page = parse(out_dir / "report.html")
    assert "Chosen branch #2: k=scale(k=5) (score = 15)" in " ".join(page.text)


@pytest.mark.parametrize("n", [112, 2000])
def test_the_metrics_figure_labels_no_more_alternatives_than_fit(n):
    """One explore with n alternatives: every label while they fit (upright, 8 pt apart), then
    every k-th; the status colours (dropped vs pruned) come from one owner."""
    import pandas as pd

    from graph.state.status import COLORS
    from pipelines.report import _metrics_figure
    from pipelines.result import Result

    t = pd.DataFrame([{"m": "svc", "m.C": i, "acc": i / n, "status": "dropped" if i % 5 else "pruned",
                       "seconds": 0.1, "chosen": i == 7, "error": None, "failed_step": None, "traceback": None}
                      for i in range(n)])
    fig = _metrics_figure(Result(table=t, value=None, values=[]), "acc")
    ax = fig.axes[0]
    width = ax.get_position().width * fig.get_figwidth()
    labels = [tick.get_text() for tick in ax.get_xticklabels()]
    assert labels[0] == "svc(C=0)" and (len(labels) == n) == (n == 112)
    assert width / len(labels) >= 8 / 72  # upright 8 pt labels, each with at least its own height of axis
    colours = {tuple(round(c, 3) for c in col.get_facecolor()[0][:3]) for col in ax.collections}
    from matplotlib.colors import to_rgb

    assert {tuple(round(c, 3) for c in to_rgb(COLORS[s])) for s in ("dropped", "pruned", "chosen")} <= colours
