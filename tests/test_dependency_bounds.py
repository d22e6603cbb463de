"""The dependency bounds say what nbtrain needs and what CI tests, in one place each.

Ray's range in ``pyproject.toml`` (every extra and Binder's requirements too) is the one
``nbtrain/_version.py`` declares, which ``connect()`` enforces; the Ray installed here is in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import ray
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra brings tomli where the standard library has no TOML reader
    import tomli as tomllib

from nbtrain._version import TESTED_RAY_MINORS

pytestmark = pytest.mark.quick
REPO = Path(__file__).resolve().parent.parent


def _requirements(binder: bool = True) -> list[Requirement]:
    """pyproject's requirements (extras included) and, with ``binder``, Binder's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    if binder:
        lines += [line for line in (REPO / "binder" / "requirements.txt").read_text().splitlines()
                  if line.strip() and not line.startswith(("#", "-"))]
    return [Requirement(line) for line in lines]


def test_every_ray_requirement_is_the_tested_range() -> None:
    rays = [r for r in _requirements() if r.name == "ray"]
    assert len(rays) >= 4
    lowest = Version(f"{TESTED_RAY_MINORS[0]}.0")
    major, minor = map(int, TESTED_RAY_MINORS[-1].split("."))
    for requirement in rays:
        assert lowest in requirement.specifier, requirement
        assert Version(f"{major}.{minor}.9") in requirement.specifier, requirement
        assert Version(f"{major}.{minor + 1}.0") not in requirement.specifier, requirement
        assert Version(f"{major}.{int(TESTED_RAY_MINORS[0].split('.')[1]) - 1}.0") not in requirement.specifier


def test_the_ray_installed_here_is_a_tested_one() -> None:
    assert ".".join(ray.__version__.split(".")[:2]) in TESTED_RAY_MINORS


def test_lower_bounds_match_the_apis_used() -> None:
    named = {r.name: r for r in _requirements(binder=False)}
    assert Version("2.5.9") not in named["torch"].specifier  # FSDP2's public fully_shard: torch 2.6
    assert Version("2.2.9") not in named["lightning"].specifier  # ModelParallelStrategy: lightning 2.3
    assert Version("5.24.1") not in named["plotly"].specifier  # figures saved with base64 arrays: plotly 6
