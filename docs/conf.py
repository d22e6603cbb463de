"""Sphinx configuration of nbtrain's documentation site (``scripts/build-docs`` builds it).

Offline by design: no intersphinx, no notebook execution. The tutorials are the
notebooks in ``notebooks/``, shown with the outputs they are committed with
(``scripts/refresh-tutorials``; see ``_ext/nbtrain_tutorials.py``); the option, magic, CLI,
REST and error references are generated from nbtrain's own declarations
(``_ext/nbtrain_reference.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # this checkout's nbtrain, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))

import os  # noqa: E402
import re  # noqa: E402

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
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path: list[str] = []

# --- MyST and notebooks: shown as stored, never executed here (the tests execute them)
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3
# notebooks start with a title cell, then use ### freely; a plotly figure (run.figure()) saves its JSON
# (application/vnd.plotly.v1+json, which myst-nb has no renderer for) beside the HTML the site shows
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]



def github_repository() -> str | None:
    """``owner/name`` of nbtrain's public GitHub repository, for the Binder badge; ``None`` while there is none.

    nbtrain has no public repository yet, so nothing is assumed: ``$NBTRAIN_GITHUB_REPOSITORY`` names it, or
    Read the Docs' clone URL when it is on GitHub.
    """
    named = os.environ.get("NBTRAIN_GITHUB_REPOSITORY", "").strip()
    if not named:
        clone = os.environ.get("READTHEDOCS_GIT_CLONE_URL", "")
        found = re.match(r"(?:https://|git@)github\.com[/:]([\w.-]+/[\w.-]+?)(?:\.git)?/?$", clone)
        named = found.group(1) if found else ""
    if named and not re.fullmatch(r"[\w.-]+/[\w.-]+", named):
        raise ValueError(f"NBTRAIN_GITHUB_REPOSITORY={named!r}: give it as owner/name, e.g. my-org/nbtrain")
    return named or None


BINDER_REPOSITORY = github_repository()
myst_substitutions = {
    "version": __version__,
    "binder_badge": (f"[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/{BINDER_REPOSITORY}"
                     "/HEAD?urlpath=lab/tree/notebooks/01_quickstart.ipynb)") if BINDER_REPOSITORY
                    else "*Binder: this build names no public repository (see [Binder](#binder) below).*",
}

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
    # run.files() returns these; their fields are in its Returns, the class is listed after Run
    ("py:class", "nbtrain._client.run.files.RunFile"),
    # run.reader is this; its members are listed after Run
    ("py:class", "nbtrain._client.run.reader.RunReader"),
]

# --- HTML
html_theme = "pydata_sphinx_theme"
html_title = f"nbtrain {__version__}"  # the version, in every page's header
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
