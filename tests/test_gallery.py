"""The example gallery's decisions (docs/gallery_hooks.py): every example is either run while the
site builds, at a stated size, or shown unexecuted with a reason; the build's pattern runs exactly
the first kind. The build itself (the pages, their output and figures) is tests/test_docs.py's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("gallery_hooks", ROOT / "docs" / "gallery_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_run_or_says_why_not(hooks):
    assert not set(hooks.BUILD_ARGS) & set(hooks.NOT_RUN)
    assert sorted({*hooks.BUILD_ARGS, *hooks.NOT_RUN}) == EXAMPLES
    for name, why in hooks.NOT_RUN.items():
        assert why and why in (ROOT / "examples" / name).read_text(), f"{name}'s page must say why it is not run"


def test_filename_pattern_runs_exactly_the_build_examples(hooks):
    pattern = re.compile(hooks.filename_pattern(hooks.BUILD_ARGS))
    ran = [e for e in EXAMPLES if pattern.search(f"/work/examples/{e}")]
    assert ran == sorted(hooks.BUILD_ARGS)
    assert not pattern.search("/work/examples/not_digits_explore.py")  # whole names only
    assert not pattern.search("/work/examples/digits_explore.py.md5")


def test_build_args_add_the_report_folder(hooks):
    assert hooks.build_args("digits_explore.py", "/tmp/r") == ["--report", "/tmp/r/digits_explore"]
    assert hooks.build_args("tune_mnist.py", "/tmp/r")[:1] == ["--quick"]
    assert hooks.report_dir("/x/examples/tune_mnist.py").name == "tune_mnist"


def test_unknown_or_unrun_examples_are_refused_with_the_fix(hooks):
    with pytest.raises(ValueError, match=r"new\.py: add it to BUILD_ARGS .* or NOT_RUN"):
        hooks.build_args("new.py", "/tmp/r")
    with pytest.raises(ValueError, match=r"mnist_sma\.py is not run at build time .*minutes"):
        hooks.build_args("mnist_sma.py", "/tmp/r")


def test_order_lists_the_first_contact_first(hooks):
    key = hooks.ExampleOrder("")
    assert sorted(EXAMPLES, key=key)[0] == "digits_explore.py"
    assert sorted(EXAMPLES, key=key)[-1] == "mnist_sma.py"
