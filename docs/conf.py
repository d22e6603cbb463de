"""Sphinx configuration of nbtrain's documentation site (``scripts/build-docs`` builds it).

Offline by design: no intersphinx, no notebook execution. The tutorials are the
notebooks in ``notebooks/``, shown with the outputs the test suite's last run left
in ``docs/_executed/`` (see ``_ext/nbtrain_tutorials.py``); the option, magic, CLI,
REST and error references are generated from nbtrain's own declarations
(``_ext/nbtrain_reference.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # this checkout's nbtrain, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))

from nbtrain._version import __version__  # noqa: E402

project = "nbtrain"
author = "the nbtrain authors"
copyright = "the nbtrain authors"
release = version = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
    "nbtrain_reference",
    "nbtrain_tutorials",
]

root_doc = "index"
smartquotes = False  # --flags and "quotes" stay as typed (they are copied into notebooks and terminals)
exclude_patterns = ["_build", "_executed", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path: list[str] = []

# --- MyST and notebooks: shown as stored, never executed here (the tests execute them)
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # notebooks start with a title cell, then use ### freely

# --- API reference from docstrings (Google style, as nbtrain's docstrings are written)
autosummary_generate = False  # the overview tables link to the entries on the same page
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# --- Nitpicky about nbtrain's own names: every reference to ``nbtrain.*`` must resolve.
# Third-party and standard-library types (torch, ray, ipywidgets, typing...) have no
# inventory here (the build is offline, without intersphinx), so they are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!nbtrain\b).*")]
nitpick_ignore = [
    # prepare_loader() returns this private wrapper of the user's DataLoader; its docstring says what it does
    ("py:class", "nbtrain._cluster.rank.data.loading.PreparedLoader"),
    # compare() returns this; its methods (curves, table, close) are listed under compare
    ("py:class", "nbtrain._views.compare.Comparison"),
    # run.stacks() and run.profile() return these; their fields are in the methods' Returns
    ("py:class", "nbtrain._client.run.inspection_results.Stacks"),
    ("py:class", "nbtrain._client.run.inspection_results.Profile"),
    # run.reader is this; its members are listed after Run
    ("py:class", "nbtrain._client.run.reader.RunReader"),
]

# --- HTML
html_theme = "pydata_sphinx_theme"
html_title = "nbtrain"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
