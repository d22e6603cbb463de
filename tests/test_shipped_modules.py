"""A module beside the notebook (or the script) reaches the ranks, as the notebook has it at launch.

A script run by ``python3`` imports ``mymodels`` from a folder beside it and launches a function that
uses its class (sent by name) and imports it in its body. The folder is removed once ``launch()``
returns, as a remote cluster would never have it. The module is then written anew with another value
and the same function launched again: the warm worker that ran the first version runs the new one.
A module too large to send, or one holding a compiled extension, is refused before any rank starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = '''
import json, os, shutil, sys
import nbtrain
from nbtrain._packing import shipping

here = os.path.dirname(os.path.abspath(__file__))
helpers = os.path.join(here, "helpers")
sys.path.insert(0, helpers)

def write_models(scale):
    os.makedirs(helpers, exist_ok=True)
    with open(os.path.join(helpers, "mymodels.py"), "w") as f:
        f.write(f"SCALE = {scale}\\n\\nclass Net:\\n    def value(self):\\n        return SCALE\\n")

write_models(2)
from mymodels import Net
import bigpkg, fastpkg

def train(config):
    import mymodels
    return [Net().value(), mymodels.SCALE, os.getpid()]

nbtrain.connect(progress=lambda message: None)
out = {}
first = nbtrain.launch(train, workers=1, name="shipped-first")
shutil.rmtree(helpers)
first.wait(timeout=120)
out["first"] = first.result[0]
out["first_modules"] = first.summary().get("modules")
write_models(5)  # edited after the first run; the kernel's own mymodels is not reloaded
second = nbtrain.launch(train, workers=1, name="shipped-second")
second.wait(timeout=120)
out["second"] = second.result[0]
shipping.MAX_SHIPPED_BYTES = 1000
for name, fn in (("big", lambda config: bigpkg.VALUE), ("fast", lambda config: fastpkg.VALUE)):
    try:
        nbtrain.launch(fn, workers=1, name=f"shipped-{name}")
        out[name] = None
    except nbtrain.NotSerializableError as exc:
        out[name] = str(exc)
out["runs"] = sorted(r["name"] for r in nbtrain.runs())
print(json.dumps(out))
'''


def test_a_module_beside_the_script_reaches_the_ranks_and_is_never_stale(cluster, tmp_path: Path) -> None:
    (tmp_path / "bigpkg").mkdir()
    (tmp_path / "bigpkg" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "bigpkg" / "weights.bin").write_bytes(b"\0" * 5000)
    (tmp_path / "fastpkg").mkdir()
    (tmp_path / "fastpkg" / "__init__.py").write_text("VALUE = 2\n")
    (tmp_path / "fastpkg" / "_speedups.so").write_bytes(b"\x7fELF")
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(["python3", str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=os.environ.copy(), stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    assert out["first"][:2] == [2, 2]
    assert out["first_modules"] and out["first_modules"][0].startswith("mymodels@")
    assert out["second"][:2] == [5, 5], "the second run must train the edited module"
    assert out["second"][2] == out["first"][2], "the same warm worker ran both runs"
    assert "`bigpkg`" in out["big"] and "pass 1000 bytes" in out["big"] and "Install `bigpkg`" in out["big"]
    assert "`fastpkg`" in out["fast"] and "_speedups.so" in out["fast"] and "compiled extension" in out["fast"]
    assert "shipped-big" not in out["runs"] and "shipped-fast" not in out["runs"]


@pytest.mark.quick
def test_a_warm_worker_forgets_an_earlier_runs_version_of_the_modules_and_keeps_the_rest(tmp_path, monkeypatch):
    """What a shipped function and a script both do before importing from their unpacked folder."""
    import types

    from nbtrain._packing.shipping import forget_earlier_versions

    root = tmp_path / "nbtrain-shipped" / "new"
    modules = {"old_helper": tmp_path / "nbtrain-shipped" / "old" / "old_helper.py",  # an earlier run's folder
               "kept_here": root / "kept_here.py",                                  # this run's own folder
               "datautils": tmp_path / "elsewhere" / "datautils.py",                 # named by this run
               "datautils.io": tmp_path / "elsewhere" / "datautils" / "io.py",
               "unrelated": tmp_path / "site" / "unrelated.py"}
    for name, path in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__file__=str(path)))
    forget_earlier_versions(root, ("datautils",))
    assert {name for name in modules if name in sys.modules} == {"kept_here", "unrelated"}
