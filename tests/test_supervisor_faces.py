"""The run's supervisor shows each caller its own face: the methods the ranks call, those notebooks call, and its
own lifecycle, each in a module of its own, composed into one Ray actor whose method names (what callers use
over Ray) and concurrency groups stay as they were. No cluster: Ray builds the actor class without one."""

from __future__ import annotations

import pytest

from nbtrain._cluster.supervisor.supervisor import RunSupervisor, supervisor_actor
from nbtrain._cluster.supervisor.supervisor_for_notebooks import ForNotebooks
from nbtrain._cluster.supervisor.supervisor_for_ranks import ForRanks

pytestmark = pytest.mark.quick

RANKS_CALL = {"push", "push_many", "record_checkpoint", "keep_post_mortem", "control", "standing_questions",
              "command_learnt", "step_for",
              "command_applied", "command_result", "guard_tripped", "checkpoint_at", "checkpoint_to_resume"}
NOTEBOOKS_CALL = {"steer", "command_results", "command_applied_yet", "fork_source", "latest_checkpoint",
                  "post_mortem", "drain", "poll", "summary", "config", "frame_ipc", "result", "stop", "resume",
                  "delete"}


def _public(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


def test_each_public_method_lives_in_the_face_of_who_calls_it():
    assert _public(ForRanks) == RANKS_CALL
    assert _public(ForNotebooks) == NOTEBOOKS_CALL
    assert _public(RunSupervisor) == set(), "the actor class itself holds only its lifecycle"


def test_the_actor_answers_every_method_name_in_its_concurrency_group():
    meta = supervisor_actor().__ray_metadata__.method_meta
    assert set(meta.methods) >= RANKS_CALL | NOTEBOOKS_CALL
    groups = {name: group for name, group in meta.concurrency_group_for_methods.items() if group}
    assert groups == {"control": "ranks", "step_for": "ranks", "poll": "readers", "command_results": "readers",
                      "command_applied_yet": "readers"}
