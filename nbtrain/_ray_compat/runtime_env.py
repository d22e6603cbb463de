"""Uploading the notebook machine's folders named by a run's ``runtime_env`` (``working_dir``, ``py_modules``)."""

from __future__ import annotations

import os
from typing import Any


def upload_local_paths(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` and ``py_modules`` uploaded to the cluster (``gcs://`` URIs
    in their place), so that ranks on any node — and a cluster on another machine — find them.

    Ray's upload of a runtime env's folders (``ray._private.runtime_env``). Public instead: none — Ray
    uploads local paths itself only for a Ray Client session's own ``ray.init(runtime_env=)``, and the
    ranks' actors are created by the run's supervisor on the cluster, where the notebook's paths do not
    exist. Degrades: a failed upload refuses the launch before anything starts (``launch()`` names the
    folder and what to do; Ray's message says which file or size limit).
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
