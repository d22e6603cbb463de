"""Whether the notebook and a cluster run a Ray nbtrain supports, and the same Ray, Python and nbtrain.

Ray Client and a driver need the same Ray release on both sides (and the same Python minor); the run's
code and spec cross between the notebook and the ranks pickled, so nbtrain must match too. Each refusal
names both versions and the one command that matches the notebook to the cluster:
``pip install nbtrain "ray[client,default,train]==2.56.1"``.
"""

from __future__ import annotations

import platform

from packaging.version import InvalidVersion, Version

from nbtrain._exceptions import ConnectionFailedError, VersionMismatchError
from nbtrain._version import TESTED_RAY_MINORS, __version__

MIN_RAY = (2, 54)  # 2.52-2.53: the dashboard agent's HTTP job endpoint skips the token check


def notebook_versions() -> dict[str, str]:
    import ray

    return {"ray": str(ray.__version__), "python": platform.python_version(), "nbtrain": __version__}


def check_against_notebook(cluster: dict[str, str]) -> None:
    """:func:`check_versions` of what ``cluster`` runs (``ray``, ``python``, maybe ``nbtrain``) against this process."""
    check_versions(cluster, notebook_versions())


def check_ray_supported(version: str, side: str) -> None:
    """Refuse, on ``side`` ("notebook" or "cluster"), a Ray older than :data:`MIN_RAY` (it cannot be made
    safe) or outside the Ray releases nbtrain is tested with (``TESTED_RAY_MINORS``)."""
    try:
        release = Version(version).release
    except InvalidVersion:
        return  # not a version Ray publishes (a local build): nothing to judge by
    where = "in this notebook's environment" if side == "notebook" else "on the cluster"
    fix = ("in the kernel's environment and restart the kernel" if side == "notebook"
           else "on every node of the cluster and restart it")
    if release[:2] >= MIN_RAY:
        if ".".join(map(str, release[:2])) in TESTED_RAY_MINORS:
            return
        tested, newest = f"{TESTED_RAY_MINORS[0]} to {TESTED_RAY_MINORS[-1]}", TESTED_RAY_MINORS[-1]
        msg = (f"Ray {version} {where} is not one nbtrain {__version__} is tested with (Ray {tested}): nbtrain "
               f"relies on Ray internals (Ray Train's seam, the raylet, the autoscaler's state) that a Ray release "
               f"may change. Install a tested Ray {fix}: `pip install \"ray[client,default,train]=={newest}.*\"`, "
               f"or an nbtrain release tested with Ray {version}.")
        raise VersionMismatchError(msg)
    minimum = ".".join(map(str, MIN_RAY))
    msg = (f"Ray {version} {where} is too old: nbtrain needs Ray >= {minimum}, because Ray before 2.52 "
           f"has no token authentication and in 2.52-2.53 the dashboard agent's HTTP job endpoint does "
           f"not check the token, so anyone who can reach that port can run code on the cluster. "
           f"Upgrade Ray {fix}: `pip install -U \"ray[client,default]>={minimum}\"`.")
    raise VersionMismatchError(msg)


def check_versions(cluster: dict[str, str], local: dict[str, str]) -> None:
    """Raise :class:`VersionMismatchError` naming both sides when Ray, Python (major.minor) or nbtrain differ,
    with the one command that makes the notebook's environment match the cluster."""
    problems = []
    ray_differs = cluster["ray"] != local["ray"]
    if ray_differs:
        problems.append(f"Ray {local['ray']} in the notebook but Ray {cluster['ray']} on the cluster")
    python_differs = cluster["python"].split(".")[:2] != local["python"].split(".")[:2]
    if python_differs:
        problems.append(f"Python {local['python']} in the notebook but Python {cluster['python']} on the cluster")
    nbtrain_differs = bool(local.get("nbtrain") and cluster.get("nbtrain")
                           and not cluster["nbtrain"].startswith("missing") and cluster["nbtrain"] != local["nbtrain"])
    if nbtrain_differs:
        problems.append(f"nbtrain {local['nbtrain']} in the notebook but nbtrain {cluster['nbtrain']} on the cluster "
                        f"(the run's code and spec cross between them pickled)")
    if problems:
        nbtrain_pin = f"\"nbtrain=={cluster['nbtrain']}\"" if nbtrain_differs else "nbtrain"
        command = f"pip install {nbtrain_pin} \"ray[client,default,train]=={cluster['ray']}\""
        python = cluster["python"].split(".")[:2]
        msg = ("The notebook and the cluster run different versions: " + "; ".join(problems) + ". Match the "
               "notebook to the cluster: "
               + (f"a Python {'.'.join(python)} environment for the kernel, in which " if python_differs else "")
               + f"`{command}`, then restart the kernel (or install the notebook's versions on every node).")
        raise VersionMismatchError(msg)
    if cluster.get("nbtrain", "").startswith("missing"):
        msg = (f"nbtrain cannot be imported on the cluster's nodes ({cluster['nbtrain']}). Install it there "
               "(`pip install nbtrain` in the image/nodes) so workers can run the training loop.")
        raise ConnectionFailedError(msg)
