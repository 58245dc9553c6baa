"""The user guide matches the code: every Python block in ``docs/guide/*.md`` runs (one process,
so the blocks share its kept embedded cluster) unless an HTML comment right before it says why it
cannot run on its own (``<!-- no-run: reason -->``: a sketch with ``...``, MNIST downloads, a
reader's own data); every dotted name the docs show in backticks (``pipelines.X``, ``graph.X``,
``gpu.X``) exists; and docs/architecture.md's layout tree lists every sub-package of ``graph``."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
FENCE = re.compile(r"^(?P<indent> *)```python\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)
NO_RUN = re.compile(r"<!--\s*no-run:\s*(?P<why>.*?)\s*-->\s*$")
DOTTED = re.compile(r"(?<![\w./])((?:pipelines|graph|gpu)(?:\.[A-Za-z_]\w*)+)")


def blocks(path: Path) -> list[dict]:
    """The Python blocks of a Markdown file: ``line``, ``code`` (dedented) and ``why`` (the
    no-run reason, ``None`` for a block that runs)."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NO_RUN.search(before)
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("code").splitlines())
        out.append({"file": path.name, "line": text[: m.start()].count("\n") + 1, "code": code,
                    "why": marker.group("why") if marker else None})
    return out


def test_every_guide_block_runs_or_says_why_not():
    found = [b for p in GUIDE for b in blocks(p)]
    assert len(found) >= 10
    for b in found:
        assert b["why"] is None or len(b["why"]) >= 10, f"{b['file']}:{b['line']}: say why the block cannot run"
    assert sum(b["why"] is None for b in found) >= 2  # the guide has blocks that run


def test_a_no_run_marker_is_read_and_a_block_without_one_runs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- no-run: needs the reader's data -->\n```python\nx = ...\n```\n\n```python\ny = 1\n```\n")
    assert [(b["why"], b["code"]) for b in blocks(page)] == [("needs the reader's data", "x = ..."), (None, "y = 1")]


RUNNER = """
import json, sys, traceback
if __name__ == "__main__":
    failed = []
    for b in json.loads(sys.stdin.read()):
        try:
            exec(compile(b["code"], f"{b['file']}:{b['line']}", "exec"), {"__name__": "__main__"})
        except BaseException:
            failed.append(f"{b['file']}:{b['line']}: " + traceback.format_exc(limit=3))
    print(json.dumps(failed))
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_guides_runnable_blocks_run():
    import subprocess

    runnable = [b for p in GUIDE for b in blocks(p) if b["why"] is None]
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(runnable), capture_output=True, text=True,
                          cwd=ROOT, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed == [], "\n".join(failed)


def resolve(name: str):
    """The object ``name`` (``graph.cluster.embedded``, ``pipelines.Result.history``) names:
    its longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def doc_names() -> dict[str, str]:
    """Dotted project names in backticks in the README and docs/ (the changelog aside: it
    records names as they were), each with a file that shows it."""
    files = [ROOT / "README.md"] + [p for p in (ROOT / "docs").rglob("*.md") if p.name != "changelog.md"
                                    and "_build" not in p.parts]
    found: dict[str, str] = {}
    for path in files:
        for span in re.findall(r"`([^`\n]+)`", path.read_text()):
            for m in DOTTED.finditer(span):
                found.setdefault(m.group(1), str(path.relative_to(ROOT)))
    return found


def test_dotted_names_in_the_docs_exist_in_the_code():
    names = doc_names()
    assert len(names) > 100
    missing = []
    for name, where in sorted(names.items()):
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{where}: `{name}` ({exc})")
    assert not missing, "names the docs show that the code does not have:\n" + "\n".join(missing)


def test_the_name_check_sees_a_name_that_is_gone():
    with pytest.raises(AttributeError):
        resolve("graph.spec.no_such_function")
    assert resolve("graph.labels.value_text").__name__ == "value_text"


def test_the_architecture_layout_lists_every_graph_subpackage():
    tree = (ROOT / "docs" / "architecture.md").read_text().split("## 1. Layout", 1)[1].split("```")[1]
    listed = set(re.findall(r"^  (\w+)/", tree, re.M))
    actual = {p.parent.name for p in (ROOT / "graph").glob("*/__init__.py")}
    assert listed == actual, f"docs/architecture.md §1 lists {sorted(listed)}; graph/ has {sorted(actual)}"
