"""The public surface is nbtrain/__init__.py's __all__, and the package layout shows which process runs what."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain

pytestmark = pytest.mark.quick

PACKAGE = Path(nbtrain.__file__).parent

EXPECTED_ALL = [
    "Cluster", "ConnectionFailedError", "InvalidOptionError", "LaunchPanel", "NbtrainError", "NotConnectedError",
    "NotSerializableError", "ResourcesUnavailableError", "Run", "RunExistsError", "RunFailedError", "RunNotFoundError",
    "RunState", "StorageError", "Sweep", "SweepFailedError", "TorchTrainer", "TrainContext", "Trial",
    "VersionMismatchError", "WorkerState", "attach", "attach_sweep", "backward", "checkpoint_requested", "compare",
    "connect",
    "disconnect", "get_context", "get_dataset_shard", "launch", "launch_script", "load_checkpoint", "on_command",
    "on_rewind", "prepare_loader",
    "prepare_model", "prepare_optimizer", "release_warm", "report", "runs", "save_checkpoint", "steerable",
    "stop_requested", "sweeps",
    "tune",
]


def test_all_is_pinned_sorted_and_every_name_resolves():
    assert nbtrain.__all__ == EXPECTED_ALL
    assert nbtrain.__all__ == sorted(nbtrain.__all__)
    for name in nbtrain.__all__:
        assert getattr(nbtrain, name) is not None


# Integrations users import by name (nbtrain.lightning.trainer): public, pinned, and loaded only when used.
PUBLIC_SUBMODULES = {"lightning": ["NbtrainCheckpoint", "NbtrainEnvironment", "NbtrainLogger", "resume_path",
                                   "trainer", "trainer_defaults"],
                     "huggingface": ["NbtrainCallback"]}


def test_every_module_but_the_package_root_and_the_integrations_is_private():
    public = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                    if not any(part.startswith("_") for part in path.relative_to(PACKAGE).parts)
                    and "labextension" not in path.parts)
    expected = sorted(f"{name}.py" for name in PUBLIC_SUBMODULES)
    assert public == expected, f"modules outside private subpackages: {public}"


def test_integrations_are_pinned_and_they_and_plotly_are_imported_only_when_asked_for():
    import importlib
    import subprocess
    import sys

    for name, exported in PUBLIC_SUBMODULES.items():
        assert importlib.import_module(f"nbtrain.{name}").__all__ == exported
        assert getattr(nbtrain, name).__name__ == f"nbtrain.{name}"
    probe = ("import sys, nbtrain; "
             "print(sorted(m for m in ('lightning', 'transformers', 'plotly') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_code_is_grouped_by_the_process_it_runs_in():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert {"_client", "_cluster", "_views", "_lab"} <= packages


