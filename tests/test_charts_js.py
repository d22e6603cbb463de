"""The widgets' front ends (``static/``) under Node's own test runner, in the suite: ``tests/js/charts.test.mjs``
feeds the chart renderer the kernel's messages and a saved snapshot and reads the SVG it draws (points, broken
lines, marks, bars, the "hello" of a new view); ``tests/js/dashboard.test.mjs`` draws the run dashboard's page
from its traits and reads the message each click sends. Node is required already (the lab extension)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

JS_TESTS = Path(__file__).resolve().parent / "js"


def test_the_charts_front_end_draws_what_the_kernel_sends():
    node = shutil.which("node")
    assert node is not None, "Node.js 20 or newer is needed (it builds the lab extension too): install it"
    done = subprocess.run([node, "--test", str(JS_TESTS)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"^# pass (\d+)$", done.stdout, re.M)
    assert passed and int(passed[1]) > 0 and "# fail 0" in done.stdout, done.stdout[-2000:]
