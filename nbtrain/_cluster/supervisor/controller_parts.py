"""What the supervisor hands its run's controller: the two policies and the callbacks, wired in one place.

The controller builds none of its parts (as Ray Train v2's controller is handed its scaling and failure
policies and its callbacks), so a unit test hands it fakes; here is the run's own wiring. The callbacks'
order is the order each hook is called in: the NaN stop answers a watch tick before a stall does, and the
rows still on their way land before the no-rows note counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nbtrain._cluster.elastic import policy
from nbtrain._cluster.elastic.policy import RayCluster, SizingPolicy
from nbtrain._cluster.spec import RunSpec
from nbtrain._cluster.supervisor.controller_callback import ControllerCallback
from nbtrain._cluster.supervisor.epoch_hold import EpochHold
from nbtrain._cluster.supervisor.failure_policy import FailurePolicy
from nbtrain._cluster.supervisor.guard_trips import GuardTrips
from nbtrain._cluster.supervisor.logger_lifecycle import LoggerLifecycle
from nbtrain._cluster.supervisor.missing_rows import NoRowsNote, UnsentRows
from nbtrain._cluster.supervisor.nan_stop import NanStop
from nbtrain._cluster.supervisor.resizes import Resizes
from nbtrain._cluster.supervisor.stall_watch import StallWatch
from nbtrain._cluster.supervisor.stragglers import StragglerFlags

Say = Callable[[str, str], None]  # an event on the run's feed: (kind, message)


def failure_policy_for(spec: RunSpec) -> FailurePolicy:
    """A fresh failure budget of ``spec``'s ``max_failures`` (a launch, a user's resume)."""
    return FailurePolicy(spec.options.max_failures)


def sizing_for(spec: RunSpec, say: Say) -> SizingPolicy:
    """``spec``'s sizing: a fixed size, or an elastic run's policy reading the Ray cluster it runs on."""
    return policy.for_run(spec.options, RayCluster(), say)


def callbacks_for(spec: RunSpec, run_dir: Path) -> list[ControllerCallback]:
    """Everything the controller watches besides its policies, in the order it is told of each hook."""
    return [NanStop(), StallWatch(), EpochHold(), StragglerFlags(spec.options.straggler_window_s), Resizes(),
            GuardTrips(), LoggerLifecycle(run_dir), UnsentRows(), NoRowsNote()]
