"""Ray's internals that nbtrain leans on, declared here once each (the rest still live where they are
used; moving them all here is issue 36's first item).

The head node: Ray gives it the custom resource ``node:__internal_head__``, which is how nbtrain pins
the run's bookkeeping (supervisors, sweep supervisors, the warm pool, reads of stored runs) to the head
and tells the head apart in ``ray.nodes()``. Used in every process.
"""

from __future__ import annotations

import os
from typing import Any

HEAD_NODE_RESOURCE = "node:__internal_head__"


def on_head_node() -> dict[str, float]:
    """Ray ``resources=`` that place an actor or task on the head node (a sliver: it takes no slot)."""
    return {HEAD_NODE_RESOURCE: 0.001}


def is_head_node(node: dict[str, Any]) -> bool:
    """Whether an entry of ``ray.nodes()`` is the head node."""
    return HEAD_NODE_RESOURCE in node.get("Resources", {})


def upload_local_paths(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` and ``py_modules`` uploaded to the cluster (``gcs://`` URIs
    in their place), so that ranks on any node — and a cluster on another machine — find them.

    Private: Ray uploads local paths itself only for a Ray Client session's own ``ray.init(runtime_env=)``;
    the ranks' actors are created by the run's supervisor on the cluster, where the notebook's paths do
    not exist. No public API does this from a client. If it fails, ``launch()`` raises before anything
    starts, naming the path (Ray's message says which file or size limit).
    """
    import logging

    quiet = logging.getLogger("nbtrain.upload")
    # The upload first asks the server to pin the package for a while, which Ray Client's server does not
    # implement (it retries for ever); 0 skips the pin. The run's supervisor holds the packages instead
    # (see _runtime_env.packages_to_hold).
    from ray._private.ray_constants import RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S_ENV_VAR as pin_variable

    before = os.environ.get(pin_variable)
    os.environ[pin_variable] = "0"
    try:
        uploaded = _upload(runtime_env, quiet)
    finally:
        if before is None:
            os.environ.pop(pin_variable, None)
        else:
            os.environ[pin_variable] = before
    uploaded.pop("excludes", None)  # applied by the upload
    return uploaded


def _upload(runtime_env: dict[str, Any], quiet: Any) -> dict[str, Any]:
    import tempfile

    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    with tempfile.TemporaryDirectory(prefix="nbtrain-upload-") as scratch:
        uploaded: dict[str, Any] = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True,
                                                               scratch_dir=scratch, logger=quiet)
        uploaded = upload_working_dir_if_needed(uploaded, include_gitignore=True, scratch_dir=scratch, logger=quiet)
    return uploaded
