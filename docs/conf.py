"""Sphinx configuration of the hbnn docs (MyST Markdown, pydata-sphinx-theme); `make docs` builds it offline."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT / "src"), str(DOCS / "_ext")]

import hbnn  # noqa: E402

project = "hbnn"
author = "hbnn authors"
copyright = "hbnn authors"
release = version = hbnn.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "hbnn_reference",  # writes the params reference and the API pages at build time
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc sections say what goes in and out
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False

# Offline: no intersphinx and no remote images, so the build needs no network. Equations are MathJax (the
# reader's browser loads it; offline the TeX source shows).
html_theme = "pydata_sphinx_theme"
html_title = "hbnn"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "icon_links": [],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_last_updated_fmt = None
html_show_sourcelink = False
