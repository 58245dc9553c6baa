"""The executed example gallery (sphinx-gallery): which examples run at build time, at what size,
and how the figures their ``result.plot()`` writes reach the page.

One place decides what the build runs: :data:`BUILD_ARGS` (the examples executed, with the
command-line arguments that size them for a 2-core CI machine) and :data:`NOT_RUN` (the examples
shown unexecuted, with why). ``docs/conf.py`` turns them into sphinx-gallery's
``filename_pattern`` / ``reset_argv``; the rest of this module is the thin layer sphinx-gallery
calls while it runs an example.

>>> build_args("digits_explore.py", "/tmp/reports")
['--report', '/tmp/reports/digits_explore']
>>> build_args("tune_mnist.py", "/tmp/reports")
['--quick', '--report', '/tmp/reports/tune_mnist']
>>> filename_pattern(["a.py", "b_c.py"])
'/(a|b_c)\\\\.py$'
>>> build_args("mnist_sma.py", "/tmp/reports")
Traceback (most recent call last):
...
ValueError: mnist_sma.py is not run at build time (docs/gallery_hooks.py NOT_RUN): SMA training ...
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["BUILD_ARGS", "NOT_RUN", "build_args", "filename_pattern", "report_dir", "reset_argv",
           "clear_reports", "report_scraper", "ExampleOrder"]

# examples run while the site builds, with the arguments that keep each to seconds on 2 cores;
# every example also takes ``--report DIR`` (added by build_args): the figures shown come from there
BUILD_ARGS: dict[str, list[str]] = {
    "digits_explore.py": [],                    # the full 63 branches: ~15 s
    "sklearn_search.py": ["--quick"],           # 3 classifiers x 1 KernelPCA size x 3 folds
    "tune_mnist.py": ["--quick"],               # 4 configurations x 3 epochs
    "big_table_explore.py": ["--rows", "60000", "--rows-per-file", "30000", "--alphas", "0.1,10000"],  # 2 partitions
}
# examples shown with their code only, and why (the example's own docstring says it on its page)
NOT_RUN: dict[str, str] = {
    "staged_training.py": "about a minute of torch training on 2 CPU cores",
    "mnist_sma.py": "SMA training with auto-tuned replicas takes minutes on 2 CPU cores",
}


def build_args(example: str, reports: str | Path) -> list[str]:
    """The arguments the gallery runs ``examples/<example>`` with (``sys.argv[1:]``)."""
    if example in NOT_RUN:
        raise ValueError(f"{example} is not run at build time (docs/gallery_hooks.py NOT_RUN): {NOT_RUN[example]}")
    if example not in BUILD_ARGS:
        raise ValueError(f"{example}: add it to BUILD_ARGS (run at build time) or NOT_RUN (shown only) "
                         "in docs/gallery_hooks.py")
    return [*BUILD_ARGS[example], "--report", str(Path(reports) / Path(example).stem)]


def filename_pattern(examples) -> str:
    """sphinx-gallery's ``filename_pattern``: a regex matching exactly the examples to execute."""
    names = "|".join(re.escape(Path(e).stem) for e in sorted(examples))
    return rf"/({names})\.py$"


def report_dir(src_file) -> Path:
    """Where the example ``src_file`` writes its report while the site builds (outside the tree)."""
    return Path(tempfile.gettempdir()) / "quiver-gallery" / Path(src_file).stem


# ---------------------------------------------------------------- called by sphinx-gallery

class ExampleOrder:
    """``within_subsection_order``: the gallery lists the examples run at build time first, in
    :data:`BUILD_ARGS` order (the first contact first), then the ones shown only."""

    def __init__(self, src_dir) -> None:
        self.order = [*BUILD_ARGS, *NOT_RUN]

    def __call__(self, filename: str) -> tuple:
        name = Path(filename).name
        return (self.order.index(name) if name in self.order else len(self.order), name)


def reset_argv(gallery_conf, script_vars) -> list[str]:
    """``reset_argv``: the example's command-line arguments for this build."""
    src = Path(script_vars["src_file"])
    return build_args(src.name, report_dir(src).parent)


def clear_reports(gallery_conf, fname, when) -> None:
    """``reset_modules``: an example starts with an empty report folder (no figure of a past build)."""
    if when == "before" and fname is not None:
        shutil.rmtree(report_dir(fname), ignore_errors=True)
        _shown.pop(str(report_dir(fname)), None)


_shown: dict[str, set[str]] = {}


def report_scraper(block, block_vars, gallery_conf) -> str:
    """An image scraper: the PNGs the example's ``result.plot()`` wrote since the last code block."""
    from sphinx_gallery.scrapers import figure_rst

    folder = report_dir(block_vars["src_file"])
    shown = _shown.setdefault(str(folder), set())
    new = sorted(p for p in folder.glob("*.png") if p.name not in shown) if folder.is_dir() else []
    targets = []
    for png, target in zip(new, block_vars["image_path_iterator"]):
        shutil.copyfile(png, target)
        shown.add(png.name)
        targets.append(target)
    # one full-width image per figure (sphinx-gallery would put several side by side, as thumbnails)
    return "".join(figure_rst([target], gallery_conf["src_dir"]) for target in targets)
