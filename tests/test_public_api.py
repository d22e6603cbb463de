"""The public surface is nbtrain/__init__.py's __all__, and the package layout shows which process runs what."""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtrain

pytestmark = pytest.mark.quick

PACKAGE = Path(nbtrain.__file__).parent
MAX_MODULE_LINES = 450

EXPECTED_ALL = [
    "Cluster", "ConnectionFailedError", "InvalidOptionError", "LaunchPanel", "NbtrainError", "NotConnectedError",
    "NotSerializableError", "ResourcesUnavailableError", "Run", "RunExistsError", "RunFailedError", "RunNotFoundError",
    "RunState", "StorageError", "TorchTrainer", "TrainContext", "VersionMismatchError", "WorkerState", "attach",
    "backward", "connect", "disconnect", "get_context", "get_dataset_shard", "launch", "load_checkpoint",
    "prepare_loader", "prepare_model", "prepare_optimizer", "release_warm", "report", "runs", "save_checkpoint",
]


def test_all_is_pinned_sorted_and_every_name_resolves():
    assert nbtrain.__all__ == EXPECTED_ALL
    assert nbtrain.__all__ == sorted(nbtrain.__all__)
    for name in nbtrain.__all__:
        assert getattr(nbtrain, name) is not None


def test_every_module_but_the_package_root_is_private():
    public = [path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py")
              if not any(part.startswith("_") for part in path.relative_to(PACKAGE).parts)
              and "labextension" not in path.parts]
    assert public == [], f"modules outside private subpackages: {public}"


def test_code_is_grouped_by_the_process_it_runs_in():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert {"_client", "_cluster", "_views", "_lab"} <= packages


def test_no_module_grows_past_the_limit():
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    too_big = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_big, f"split these by job (limit {MAX_MODULE_LINES} lines): {too_big}"
