"""Every Ray from 2.54 to 2.60, for real: a cluster started by the oldest Ray's virtualenv refuses this
notebook's newer Ray first thing, naming both versions and the one command that matches them, and the
notebook that ran that command (the virtualenv's interpreter) connects; the oldest-Ray tier runs the Ray
it names (``scripts/run-tests`` runs it, ``-m oldest_ray``, in that virtualenv)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import _plain_cluster
import pytest
import ray

import nbtrain
from nbtrain._version import TESTED_RAY_MINORS

REPO = Path(__file__).resolve().parent.parent
OLDEST = TESTED_RAY_MINORS[0]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


@pytest.mark.oldest_ray
def test_the_oldest_ray_tier_runs_the_oldest_ray_and_the_lanes_the_newest():
    tier = os.environ.get("NBTRAIN_RAY_TIER")  # scripts/run-tests --oldest-ray (or --ray MINOR) sets it
    assert _minor(ray.__version__) == (tier or TESTED_RAY_MINORS[-1]), ray.__version__


def test_a_cluster_on_the_oldest_ray_refuses_this_notebook_first_and_its_match_connects(tmp_path):
    if _minor(ray.__version__) == OLDEST:
        pytest.skip("the mismatch needs a notebook on a newer Ray than the cluster's, and no supported Ray is older "
                    "than this interpreter's: the main lanes, on the newest Ray, run it")
    made = subprocess.run([str(REPO / "scripts" / "oldest-ray-venv")], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    oldest_python = made.stdout.strip().splitlines()[-1]
    with _plain_cluster.running(python=oldest_python, default_ports=True) as cluster:
        theirs = subprocess.run([oldest_python, "-c", "import ray; print(ray.__version__)"], capture_output=True,
                                text=True, timeout=60).stdout.strip()
        expected = (f"The notebook and the cluster run different versions: Ray {ray.__version__} in the notebook "
                    f"but Ray {theirs} on the cluster. Match the notebook to the cluster: "
                    f"`pip install nbtrain \"ray[client,default,train]=={theirs}\"`")
        # over Ray Client too: the GCS beside its server says it, before any session server starts
        for address, limit in ((cluster.gcs_address, 2), (cluster.client_address, 2)):
            began = time.monotonic()
            with pytest.raises(nbtrain.VersionMismatchError) as raised:
                nbtrain.connect(address, token=cluster.token, progress=lambda _m: None)
            took = time.monotonic() - began
            assert str(raised.value).startswith(expected), str(raised.value)
            assert took < limit, (address, took)  # said before anything is started on the cluster
        assert not ray.is_initialized()

        matched = _plain_cluster.run_python(
            "import nbtrain\n"
            f"cluster = nbtrain.connect({cluster.gcs_address!r}, token={cluster.token!r})\n"
            "run = nbtrain.launch(lambda: nbtrain.report(x=1), workers=2, name='oldest', wait=True)\n"
            "print('RESULT', cluster.ray_version, run.state, len(run.metrics))\n",
            cluster.driver_env(NBTRAIN_HOME=str(tmp_path / "home")), python=oldest_python)
        assert f"RESULT {theirs} succeeded 2" in matched.stdout, matched.stdout[-2000:] + matched.stderr[-4000:]
