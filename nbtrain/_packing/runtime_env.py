"""The ranks' Ray runtime environment: the ``runtime_env=`` run option, checked in the notebook and
applied on the cluster.

Most notebooks need none: the notebook's own modules travel with the function (see
:mod:`nbtrain._packing.shipping`) and ``env=`` sets variables. ``runtime_env=`` is Ray's own dict for the
rest — a package the cluster lacks (``pip``/``uv``), a folder of data files (``working_dir``), a
container image — given to every rank's process as Ray gives it to an actor. It is checked before
anything starts (Ray's own checks, plus unknown keys, which Ray would pass on silently to a plugin
that does not exist), and warm workers are reused only by a run with the same environment
(:func:`environment_key` is part of a warm worker's shape).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from nbtrain._exceptions import InvalidOptionError

RANK_PROCESS_VARIABLE = "NBTRAIN_PROCESS"  # = "rank": how nbtrain code in a process knows it is a rank's
PIP_CHECK_TIMEOUT_S = 120.0  # pip's answer on packages; past it, Ray's own setup says what it finds


def check_runtime_env(runtime_env: Any, env: dict[str, str] | None) -> None:
    """Refuse, naming the key and what to write instead, a ``runtime_env`` Ray would refuse later (or ignore)."""
    if runtime_env is None:
        return
    if not isinstance(runtime_env, dict) or not all(isinstance(key, str) for key in runtime_env):
        raise InvalidOptionError(_problem(f"a dict with text keys, like {{'pip': ['timm']}}, got {runtime_env!r:.200}"))
    from ray.runtime_env import RuntimeEnv

    public = sorted(key for key in RuntimeEnv.known_fields if not key.startswith("_"))
    unknown = sorted(set(runtime_env) - set(public))
    if unknown:
        raise InvalidOptionError(_problem(f"Ray's runtime_env keys ({', '.join(public)}); {', '.join(unknown)} "
                                          "is not one"))
    try:
        RuntimeEnv(**runtime_env)
    except (TypeError, ValueError) as exc:
        raise InvalidOptionError(_problem(f"what Ray accepts: {exc}")) from None
    variables = runtime_env.get("env_vars") or {}
    clashing = sorted(key for key in variables if key in (env or {}) and env and env[key] != variables[key])
    if clashing:
        raise InvalidOptionError(_problem(f"one value for each variable: env= and runtime_env['env_vars'] both set "
                                          f"{', '.join(clashing)} differently; set it in one of them"))
    if RANK_PROCESS_VARIABLE in variables:
        raise InvalidOptionError(_problem(f"without {RANK_PROCESS_VARIABLE} in env_vars (nbtrain sets it)"))


def for_ranks(runtime_env: dict[str, Any] | None, env: dict[str, str] | None) -> dict[str, Any]:
    """The runtime environment a rank's actor is created with: the user's, with ``env=`` and nbtrain's own
    variable added to its ``env_vars``."""
    given = dict(runtime_env or {})
    given["env_vars"] = {**(given.get("env_vars") or {}), **(env or {}), RANK_PROCESS_VARIABLE: "rank"}
    return given


def environment_key(runtime_env: dict[str, Any] | None) -> str:
    """One text for one environment (sorted JSON), so that warm workers are matched on it."""
    return json.dumps(runtime_env or {}, sort_keys=True, default=repr)


def places(runtime_env: dict[str, Any] | None) -> list[str]:
    """The folders a runtime_env names, or their uploads' URIs: its ``working_dir``, then its ``py_modules``."""
    given = runtime_env or {}
    return [str(place) for place in [given.get("working_dir"), *(given.get("py_modules") or [])] if place is not None]


def local_paths(runtime_env: dict[str, Any] | None) -> bool:
    """Whether it names folders or files of the notebook's machine, which must be uploaded before the
    cluster (perhaps another machine) can use them."""
    return any("://" not in place for place in places(runtime_env))


def pip_problem(runtime_env: dict[str, Any] | None) -> str | None:
    """What pip says, on this node of the cluster, of ``runtime_env['pip']`` packages it cannot install, in the
    time pip takes to fail (a dry run, no dependencies); ``None`` when it finds them, or cannot tell.

    Run by the supervisor before any rank: Ray builds the environment for each rank and tries 3 times, which
    took over 3 minutes for a misspelt package, and then reports a traceback of its own agent.
    """
    from ray.runtime_env import RuntimeEnv

    try:
        pip = RuntimeEnv(**(runtime_env or {})).get("pip") or {}
    except (TypeError, ValueError):
        return None
    packages = [str(package) for package in pip.get("packages") or []]
    if not packages:
        return None
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                               "--quiet", "--disable-pip-version-check", *packages],
                              capture_output=True, text=True, timeout=PIP_CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return None
    return setup_failure(done.stderr, f"pip cannot install {', '.join(packages)}")


def setup_failure(output: str, what: str) -> str:
    """A runtime environment the cluster cannot build, as one paragraph: ``what``, pip's (or Ray's) own last
    error line out of ``output``, and what to do. The user's error: no traceback of Ray's agent."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("ERROR:")] or [line for line in lines
                                                                     if "Error" in line or "error" in line]
    last = (said or lines or ["(no output)"])[-1]
    return (f"runtime_env: {what}: {last[:500]} Fix runtime_env (its package names and versions, its "
            f"working_dir), or install what it names on the cluster's nodes, and launch again.")


def _problem(expected: str) -> str:
    return f"runtime_env (--runtime-env) must be {expected}. The magic takes JSON or the name of a notebook dict."


def packages_to_hold(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The uploaded folders (``gcs://`` URIs) of ``runtime_env``, for the run's supervisor to be created with.

    Ray deletes an uploaded package once no live process's environment names it; the ranks come and
    go (restarts, elastic resizes), the supervisor lives as long as the run, so it holds them. It runs in
    them too (current directory, ``sys.path``), which nbtrain's own code does not notice.
    """
    held: dict[str, Any] = {}
    given = runtime_env or {}
    if isinstance(given.get("working_dir"), str) and given["working_dir"].startswith("gcs://"):
        held["working_dir"] = given["working_dir"]
    modules = [uri for uri in given.get("py_modules") or [] if isinstance(uri, str) and uri.startswith("gcs://")]
    if modules:
        held["py_modules"] = modules
    return held
