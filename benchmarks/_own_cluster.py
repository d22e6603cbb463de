"""A measurement script's own embedded cluster: a throwaway ``NBTRAIN_HOME``, stopped at the end.

Stopped by its own home (its own process group), never with ``ray stop``, and
stopped even when ``connect()`` fails half way, after the head started.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def own_cluster(prefix: str, num_cpus: int) -> Iterator[None]:
    os.environ["NBTRAIN_HOME"] = str(Path(tempfile.mkdtemp(prefix=prefix)) / "home")
    import nbtrain  # after NBTRAIN_HOME is set, and before ray: it sets Ray's token authentication up
    from nbtrain._client.local import local_cluster

    try:
        nbtrain.connect(num_cpus=num_cpus, progress=lambda message: print(f"  [cluster] {message}", flush=True))
        yield
    finally:
        nbtrain.disconnect()
        local_cluster.stop()
