"""Names of a run's Ray objects, so any process can find them: the supervisor, its placement groups.

The kernel finds a run by its supervisor's name; a restarted supervisor finds
the placement group its previous process left behind by the group's name.
"""

from __future__ import annotations

import time
from typing import Any

NAMESPACE = "nbtrain"
ACTOR_PREFIX = "nbtrain-run:"
POOL_PREFIX = "nbtrain-warm:"
SWEEP_PREFIX = "nbtrain-sweep:"


def actor_name(run_name: str) -> str:
    return ACTOR_PREFIX + run_name


def sweep_actor_name(sweep_name: str) -> str:
    return SWEEP_PREFIX + sweep_name


def trial_run_name(sweep_name: str, index: int) -> str:
    return f"{sweep_name}-t{index}"


def group_name(run_name: str, attempt: int) -> str:
    return f"nbtrain:{run_name}:{attempt}"


def worker_name(run_name: str, attempt: int, rank: int) -> str:
    return f"nbtrain-worker:{run_name}:{attempt}:{rank}"


def pool_name(session_id: str) -> str:
    """The warm pool of one notebook session (see warm_pool)."""
    return POOL_PREFIX + session_id


def relay_name(run_name: str, attempt: int, node_id: str) -> str:
    return f"nbtrain-relay:{run_name}:{attempt}:{node_id[:12]}"


def find_supervisor(name: str) -> Any | None:
    """The run's supervisor actor on the connected cluster, or ``None``."""
    import ray

    try:
        return ray.get_actor(actor_name(name), namespace=NAMESPACE)
    except ValueError:
        return None


def run_names() -> list[str]:
    """The names of the runs whose supervisor is alive on the connected cluster."""
    import ray.util

    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(entry["name"][len(ACTOR_PREFIX):] for entry in named
                  if entry.get("namespace") == NAMESPACE and entry["name"].startswith(ACTOR_PREFIX))


NAME_RELEASE_S = 10.0  # how long a caller waits for the cluster to free an ended supervisor's name


def wait_until_name_free(name: str) -> None:
    """Until the run's supervisor is gone from the cluster (at most ``NAME_RELEASE_S``): ``ray.kill``
    returns before the cluster frees the actor's name."""
    deadline = time.monotonic() + NAME_RELEASE_S
    while find_supervisor(name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
