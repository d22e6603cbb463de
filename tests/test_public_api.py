"""The public surface is nbtrain/__init__.py's __all__, and the package layout shows which process runs what."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nbtrain

pytestmark = pytest.mark.quick

PACKAGE = Path(nbtrain.__file__).parent
MAX_MODULE_LINES = 450
# A module that splitting would scatter (one idea, one reader's path through it) may pass MAX_MODULE_LINES if its
# docstring says so on a line starting with this marker, followed by why; never past KEPT_WHOLE_MAX_LINES.
KEPT_WHOLE_MARKER = "One concept, kept whole:"
KEPT_WHOLE_MAX_LINES = 700

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


def test_integrations_are_pinned_and_imported_only_when_asked_for():
    import importlib
    import subprocess
    import sys

    for name, exported in PUBLIC_SUBMODULES.items():
        assert importlib.import_module(f"nbtrain.{name}").__all__ == exported
        assert getattr(nbtrain, name).__name__ == f"nbtrain.{name}"
    probe = "import sys, nbtrain; print(sorted(m for m in ('lightning', 'transformers') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_code_is_grouped_by_the_process_it_runs_in():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert {"_client", "_cluster", "_views", "_lab"} <= packages


def _kept_whole_reason(source: str) -> str | None:
    """The why after :data:`KEPT_WHOLE_MARKER` in a module's docstring (None without the marker or a reason)."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    for line in docstring.splitlines():
        if line.strip().startswith(KEPT_WHOLE_MARKER):
            return line.strip().removeprefix(KEPT_WHOLE_MARKER).strip() or None
    return None


def _too_big(package: Path) -> dict[str, int]:
    """Modules past the limit: past MAX_MODULE_LINES without a docstring saying why, or past KEPT_WHOLE_MAX_LINES."""
    too_big = {}
    for path in package.rglob("*.py"):
        source = path.read_text()
        lines = len(source.splitlines())
        limit = KEPT_WHOLE_MAX_LINES if _kept_whole_reason(source) else MAX_MODULE_LINES
        if lines > limit:
            too_big[str(path.relative_to(package))] = lines
    return too_big


def test_no_module_grows_past_the_limit():
    too_big = _too_big(PACKAGE)
    assert not too_big, (f"split these by concept (limit {MAX_MODULE_LINES} lines; up to {KEPT_WHOLE_MAX_LINES} for a "
                         f"module whose docstring has a line '{KEPT_WHOLE_MARKER} <why splitting would scatter it>'): "
                         f"{too_big}")


def test_the_size_check_takes_a_reason_and_no_more(tmp_path):
    body = "\n".join(f"x{i} = {i}" for i in range(500)) + "\n"
    (tmp_path / "long.py").write_text('"""A long module."""\n' + body)
    (tmp_path / "kept.py").write_text(f'"""A long module.\n\n{KEPT_WHOLE_MARKER} one table.\n"""\n' + body)
    (tmp_path / "no_reason.py").write_text(f'"""A long module.\n\n{KEPT_WHOLE_MARKER}\n"""\n' + body)
    (tmp_path / "huge.py").write_text(f'"""{KEPT_WHOLE_MARKER} one table."""\n' + body * 2)
    assert _too_big(tmp_path) == {"long.py": 501, "no_reason.py": 504, "huge.py": 1001}
