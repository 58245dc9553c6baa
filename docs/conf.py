"""Sphinx configuration for Quiver's documentation site (``make docs``).

The pages are Markdown (MyST); the API reference is generated from the packages' docstrings
(autodoc + autosummary, Google/NumPy sections via napoleon), with the PyData theme that Dask's
and scikit-learn's sites use. Build with warnings as errors::

    make docs        # sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # document this checkout, not an installed copy
sys.path.insert(0, str(DOCS))  # gallery_hooks

import gallery_hooks  # noqa: E402

project = "Quiver"
author = "the Quiver developers"
copyright = "2026, the Quiver developers"  # noqa: A001 - Sphinx's name
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "gallery/*.ipynb", "gallery/*.py"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "substitution"]
myst_heading_anchors = 3  # "page.md#a-heading" links, as GitHub renders them

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say what the arguments are
napoleon_numpy_docstring = True
napoleon_google_docstring = False


def _optional(docname: str, text: str) -> str:
    """A link to a page another change adds (``docname`` under docs/), or plain text until it lands."""
    if (DOCS / f"{docname}.md").exists():
        return f"{{doc}}`{text} </{docname}>`"
    return f"{text} (`docs/{docname}.md`)"


# Pages other work adds beside these; linked where they exist so the build stays warning-free.
myst_substitutions = {
    "sklearn_dropin": _optional("sklearn-dropin", "scikit-learn drop-in: identical vs different"),
    "gpu_check": _optional("gpu-check", "the prepared GPU check"),
}

# The example gallery: examples/*.py, run while the site builds (docs/gallery_hooks.py says which,
# at what size, and why the others are shown unexecuted), into docs/gallery/ (generated, not in git).
# A page is rebuilt only when its example changed (sphinx-gallery keeps an md5 beside it), or
# always with QUIVER_GALLERY_RERUN=1 (tests/test_docs.py: the pages it checks come from that run).
sphinx_gallery_conf = {
    "examples_dirs": str(DOCS.parent / "examples"),
    "gallery_dirs": str(DOCS / "gallery"),
    "filename_pattern": gallery_hooks.filename_pattern(gallery_hooks.BUILD_ARGS),
    "ignore_pattern": r"__init__\.py",
    "reset_argv": "gallery_hooks.reset_argv",
    "reset_modules": ("matplotlib", "gallery_hooks.clear_reports"),
    "image_scrapers": ("matplotlib", "gallery_hooks.report_scraper"),
    "abort_on_example_error": True,
    "download_all_examples": False,
    "write_computation_times": False,
    "show_memory": False,
    "min_reported_time": 0,
    "remove_config_comments": True,
    "within_subsection_order": "gallery_hooks.ExampleOrder",
    "run_stale_examples": os.environ.get("QUIVER_GALLERY_RERUN") == "1",
}

html_theme = "pydata_sphinx_theme"
html_title = "Quiver"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []
templates_path = ["_templates"]  # classes: their own members only (not scikit-learn's inherited ones)


def _skip_metadata_request_setters(app, what, name, obj, skip, options):
    """scikit-learn makes ``set_<method>_request`` on every estimator class whose method takes
    metadata (``OptunaSearchCV.fit``'s ``groups``); their docstrings cite scikit-learn's own
    glossary and labels, which this site does not have: they are scikit-learn's, not Quiver's."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_setters)
