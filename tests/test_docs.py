"""The documentation site leaves nothing out, and its code runs.

The quick checks read the site's sources and the references ``docs/_ext/nbtrain_reference.py``
generates from the code: every exported name has an entry in the API reference, every error
class a section in the troubleshooting page, every run option, sweep option, magic, CLI
subcommand and REST route its row. ``test_the_site_builds`` builds the whole site as
``scripts/build-docs`` does (offline, warnings as errors, nitpicky) from a copy of what a clone
has, in a scratch directory, and finds every tutorial's outputs on its page.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import nbtrain_reference as reference  # noqa: E402

PUBLIC_MODULES = ("nbtrain", "nbtrain.lightning", "nbtrain.huggingface")


def _documented(api: str, module: str) -> set[str]:
    """The names given an autodoc entry (``.. autofunction:: name``) under ``.. currentmodule:: module``."""
    found: set[str] = set()
    current = None
    for line in api.splitlines():
        if (match := re.match(r"\.\. currentmodule:: (\S+)", line)) is not None:
            current = match.group(1)
        elif (match := re.match(r"\.\. auto(?:function|class|exception):: (\w+)", line)) and current == module:
            found.add(match.group(1))
    return found


@pytest.mark.quick
@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_is_in_the_api_reference(module: str):
    api = (DOCS / "reference" / "api.rst").read_text()
    missing = sorted(set(importlib.import_module(module).__all__) - _documented(api, module))
    assert not missing, f"docs/reference/api.rst has no entry for {module}: {missing}"


@pytest.mark.quick
def test_every_error_class_is_in_the_troubleshooting_page():
    import nbtrain
    from nbtrain import _exceptions

    declared = {cls for cls in vars(_exceptions).values()
                if isinstance(cls, type) and issubclass(cls, nbtrain.NbtrainError)}
    assert set(reference.error_classes()) == declared
    page = "\n".join(reference.errors_rst())
    for cls in declared:
        assert f"\n{cls.__name__}\n" in page, cls
        assert "What to do:" in (cls.__doc__ or ""), f"{cls.__name__}'s docstring should say its causes and the fix"
    assert ".. nbtrain-errors::" in (DOCS / "troubleshooting.rst").read_text()


@pytest.mark.quick
def test_every_option_magic_and_command_is_in_its_reference():
    from nbtrain import _options, _sweep_options

    runs = "\n".join(reference.run_options_rst())
    for field in _options.fields():
        assert f"``{field.name}``" in runs and f"``{_options.info(field).flags[0]}``" in runs, field.name
    sweeps = "\n".join(reference.sweep_options_rst())
    for field in _sweep_options.fields():
        assert f"``{field.name}``" in sweeps, field.name
    magics = "\n".join(reference.magics_rst())
    for spelling in ("%ray_connect", "%%ray_train", "%%ray_tune", "%ray_status", "%ray_attach", "%ray_stop",
                     "%ray_debug"):
        assert f"\n{spelling}\n" in f"\n{magics}", spelling
    commands = "\n".join(reference.cli_rst())
    for name in reference.cli_subcommands():
        assert f"\nnbtrain {name}\n" in f"\n{commands}", name
    assert reference.rest_routes() and reference.rest_rst()  # raises if a route is not in the table
    for page, directive in (("options.rst", "nbtrain-run-options"), ("options.rst", "nbtrain-sweep-options"),
                            ("magics.rst", "nbtrain-magics"), ("cli.rst", "nbtrain-cli"),
                            ("rest.rst", "nbtrain-rest-routes")):
        assert f".. {directive}::" in (DOCS / "reference" / page).read_text(), (page, directive)


SECTIONS = {"getting-started": "Getting started", "tutorials": "Tutorials", "guides": "Guides",
            "reference/index": "Reference", "contributing": "Development"}


def _toctree_entries(page: Path) -> list[str]:
    """The documents a page's ``{toctree}`` blocks list, as paths from ``docs/`` without suffix."""
    entries = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), re.S):
        for line in block.splitlines():
            if line.strip() and not line.startswith(":"):
                entries.append(str((page.parent / line.strip()).resolve().relative_to(DOCS)))
    return entries


@pytest.mark.quick
def test_every_page_and_tutorial_is_in_the_site():
    """The index's toctree is the five sections (the header's tabs, each one's pages in the left sidebar);
    every other page is in exactly one section's toctree."""
    assert _toctree_entries(DOCS / "index.md") == list(SECTIONS)
    for section, title in SECTIONS.items():
        assert (DOCS / f"{section}.md").read_text().startswith(f"# {title}\n"), section
    listed = [entry for section in SECTIONS for entry in _toctree_entries(DOCS / f"{section}.md")]
    pages = {str(path.relative_to(DOCS).with_suffix("")) for path in DOCS.rglob("*")
             if path.suffix in (".md", ".rst") and not path.relative_to(DOCS).parts[0].startswith("_")
             and path.relative_to(DOCS).parts[0] != "tutorials"}
    unlisted = sorted(pages - {"index"} - set(SECTIONS) - set(listed))
    assert not unlisted, f"no section's toctree lists {unlisted}"
    assert len(listed) == len(set(listed)), "a page is in two sections"
    assert "tutorials/*" in (DOCS / "tutorials.md").read_text()
    quickstart = (ROOT / "notebooks" / "01_quickstart.ipynb").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb"))[1:]:
        assert notebook.name in quickstart, f"the quickstart's Next section does not list {notebook.name}"


def _as_a_clone_has_it(copy: Path) -> None:
    """Copy into ``copy`` the files a clone of this checkout would have once committed: tracked and new files,
    none that git ignores (no ``docs/_build``, no built extension, nothing a test run left behind)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, copy / name)


@pytest.mark.timeout(300)
def test_the_site_builds(tmp_path: Path):
    """The site as Read the Docs and CI build it, from a clean clone: offline, every warning an error, every
    reference to nbtrain's names resolved, and every tutorial page showing its notebook's committed outputs."""
    clone = tmp_path / "clone"
    _as_a_clone_has_it(clone)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                           "-d", str(tmp_path / "doctrees"), str(clone / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-6000:]
    print(f"the site from a clean clone: {time.monotonic() - started:.0f} s")
    api = (tmp_path / "html" / "reference" / "api.html").read_text()
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            assert f'id="{module}.{name}"' in api, f"{module}.{name} has no entry in the built API reference"
    pages = {page.stem: page.read_text() for page in (tmp_path / "html" / "tutorials").glob("*.html")}
    assert set(pages) == {notebook.stem for notebook in (ROOT / "notebooks").glob("*.ipynb")}
    bare = [name for name, page in sorted(pages.items()) if 'class="cell_output' not in page]
    assert not bare, f"tutorial pages with no output cells: {bare} (run scripts/refresh-tutorials)"
    assert all("The outputs below come from a run" in page for page in pages.values())


@pytest.mark.quick
def test_every_guide_with_code_says_which_tutorial_or_test_runs_it():
    """The guides' code needs a cluster, so the site does not execute it: each guide with Python code links
    the tutorial that runs the same calls (executed by tests/test_notebooks.py), or names the test in a comment
    the reader does not see (``% tested by: tests/test_x.py``), and that test exists."""
    untested = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        named = re.findall(r"^\s*% (?:tested|measured) by: (.*)$", text, re.M)
        for test in re.findall(r"tests/\w+\.py", " ".join(named)):
            assert (ROOT / test).exists(), f"{page.name} says {test} runs its code, and there is no such file"
        if "```python" in text and not named and not re.search(r"\]\(tutorials/\d\d_\w+\.ipynb\)", text):
            untested.append(page.name)
    assert not untested, f"say which tutorial or test runs the code of {untested}"


USER_PAGES = sorted(path for path in [*DOCS.glob("*.md"), *DOCS.glob("*.rst"), *(DOCS / "reference").glob("*")]
                    if path.stem not in ("development", "architecture", "contributing"))


def _what_the_reader_sees(text: str) -> str:
    """A page's text without the comments the site does not show (MyST ``%``, HTML, reST ``..`` lines)."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines()
                     if not re.match(r"\s*% ", line) and not re.match(r"\s*\.\. [^:]*(?::[^:].*)?$", line))


@pytest.mark.quick
@pytest.mark.parametrize("page", USER_PAGES, ids=lambda path: str(path.relative_to(DOCS)))
def test_every_tutorial_a_page_mentions_is_a_link_to_its_rendered_page(page: Path):
    """``notebooks/05_fault_tolerance.ipynb`` in code font is a dead end on the site: the page links the
    tutorial's rendered page (``tutorials/05_fault_tolerance.ipynb``) instead. Commands in code blocks may
    name the file (``nbtrain lab notebooks/01_quickstart.ipynb``)."""
    prose = re.sub(r"^([ \t]*)(```|~~~).*?^\1\2", "", _what_the_reader_sees(page.read_text()), flags=re.M | re.S)
    prose = re.sub(r"^\.\. code-block::.*?(?=^\S)", "", prose, flags=re.M | re.S)
    unlinked = [match.group(0) for match in re.finditer(r"(?:notebooks/)?\b\d\d_\w+\.ipynb", prose)
                if not prose[:match.start()].endswith("](tutorials/")]
    assert not unlinked, f"{page.name} names tutorials without linking them: {unlinked}"
    for target in re.findall(r"\]\(tutorials/(\d\d_\w+\.ipynb)", prose):
        assert (ROOT / "notebooks" / target).exists(), f"{page.name} links a tutorial that does not exist: {target}"


@pytest.mark.quick
@pytest.mark.parametrize("page", USER_PAGES, ids=lambda path: str(path.relative_to(DOCS)))
def test_user_pages_send_readers_to_tutorials_and_guides_not_test_files(page: Path):
    """What runs a page's code is said in a comment for the maintainers; the reader gets links. Performance is
    the exception for benchmarks: its figures come with the command that measures them."""
    seen = _what_the_reader_sees(page.read_text())
    paths = re.findall(r"\btests/\w+" + ("" if page.stem == "performance" else r"|\bbenchmarks/\w+"), seen)
    assert not paths, f"{page.name} points readers at {paths}"


@pytest.mark.quick
def test_every_cli_argument_says_what_leaving_it_out_does():
    """The CLI reference's default column is filled for every argument: from argparse's default, or from the
    ``(default: ...)`` its help ends with when the default is decided later (``None``)."""
    for name, (_help, parser) in reference.cli_subcommands().items():
        for row in reference._argument_rows(parser, set(), strict=True):
            assert row[1].strip(), (name, row)
    page = "\n".join(reference.cli_rst())
    assert "this machine's" in page and "where the registry says the run is" in page


@pytest.mark.quick
@pytest.mark.parametrize("cls", ["Run", "Sweep"])
def test_the_api_reference_groups_every_public_member_without_the_constructor(cls: str):
    """Run and Sweep come from nbtrain's functions, so their entries show no constructor, and their members
    are listed one by one under a heading each (following, steering, ...): a new member must be given one."""
    import nbtrain

    api = (DOCS / "reference" / "api.rst").read_text()
    assert f".. autoclass:: {cls}()\n   :no-members:" in api
    entry = api.split(f".. autoclass:: {cls}()", 1)[1].split("\n.. ", 1)[0]
    listed = set(re.findall(r"\.\. auto(?:method|property):: (\w+)", entry))
    public = {name for name in dir(getattr(nbtrain, cls)) if not name.startswith("_")}
    assert public <= listed, f"give {sorted(public - listed)} a place among {cls}'s groups in docs/reference/api.rst"
    assert listed <= public, f"docs/reference/api.rst lists {sorted(listed - public)}, which {cls} no longer has"


@pytest.mark.quick
def test_the_binder_badge_names_a_repository_only_when_the_build_is_told_one(monkeypatch: pytest.MonkeyPatch):
    """nbtrain has no public repository yet: no badge to a made-up owner; one for the repository named."""
    import runpy

    def badge() -> str:
        return runpy.run_path(str(DOCS / "conf.py"))["myst_substitutions"]["binder_badge"]

    monkeypatch.delenv("NBTRAIN_GITHUB_REPOSITORY", raising=False)
    monkeypatch.delenv("READTHEDOCS_GIT_CLONE_URL", raising=False)
    assert "mybinder.org/v2" not in badge()
    assert "{{ binder_badge }}" in (DOCS / "tutorials.md").read_text()
    assert "OWNER" not in (DOCS / "tutorials.md").read_text()
    monkeypatch.setenv("READTHEDOCS_GIT_CLONE_URL", "https://github.com/acme/nbtrain.git")
    assert "https://mybinder.org/v2/gh/acme/nbtrain/HEAD?urlpath=lab/tree/notebooks/01_quickstart.ipynb" in badge()
    monkeypatch.setenv("NBTRAIN_GITHUB_REPOSITORY", "my-org/nbtrain-fork")
    assert "/gh/my-org/nbtrain-fork/HEAD" in badge()
    monkeypatch.setenv("NBTRAIN_GITHUB_REPOSITORY", "https://github.com/my-org/nbtrain")
    with pytest.raises(ValueError, match=r"NBTRAIN_GITHUB_REPOSITORY=.*owner/name"):
        badge()


@pytest.mark.quick
def test_the_changelog_covers_the_newest_commit():
    """The changelog's range of dates reaches the day of the newest commit (it said "to 2026-11-27" while the
    work went on for days): a change that lands on a new day updates it."""
    newest = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d"], cwd=ROOT,
                            capture_output=True, text=True, env={**os.environ, "TZ": "UTC"})
    if newest.returncode != 0 or not newest.stdout.strip():
        pytest.fail(f"git cannot say the newest commit's date here: {newest.stderr.strip()}")
    said = re.search(r"the work of\s+(\d{4}-\d\d-\d\d) to (\d{4}-\d\d-\d\d)", (DOCS / "changelog.md").read_text())
    assert said, "docs/changelog.md no longer says the range of dates its entries cover"
    assert said.group(2) >= newest.stdout.strip(), (
        f"docs/changelog.md covers the work up to {said.group(2)}; the newest commit is of {newest.stdout.strip()}: "
        "add what changed since and move the range's end")
