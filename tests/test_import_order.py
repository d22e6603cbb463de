"""Importing nbtrain has no side effects, the token works whatever was imported first, and
importing Ray (every process a run starts does) stays quick where nbtrain is installed.

nbtrain sends the cluster's token with each Ray Client connection
(``ray.init(address, _metadata=[("authorization", "Bearer …")])``, see
nbtrain/_client/connecting/auth.py) rather than switching on Ray's own token mode, which
Ray reads from ``RAY_AUTH_MODE`` once, at ``import ray``. So a notebook may
import ``ray`` before ``nbtrain``, and the process that runs the notebook
(nbclient, papermill, Binder) needs no nbtrain and no ``RAY_AUTH_*`` variable.

Every check runs in a fresh Python process: this test process imported nbtrain
long ago and cannot show what an import does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from nbtrain._client.local import local_cluster

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_TIMEOUT_S = 420


def _env(**overrides: str) -> dict[str, str]:
    """This environment without any Ray token setting or address: what a fresh kernel would see."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("RAY_AUTH_") and key not in ("RAY_ADDRESS", "RAY_CLIENT_MODE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(overrides)
    return env


def _python(code: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _token_file() -> str:
    info = local_cluster.status()
    assert info is not None, "the session's local cluster is not running"
    return info.token_path


@pytest.mark.quick
def test_import_changes_no_environment_variable_and_creates_no_file(tmp_path: Path):
    """Importing Ray would already fail this: ``import ray`` sets RAY_CLIENT_MODE."""
    nbtrain_home, user_home = tmp_path / "nbtrain-home", tmp_path / "home"
    nbtrain_home.mkdir()
    user_home.mkdir()
    result = _python("""
        import json, os
        before = dict(os.environ)
        import nbtrain
        print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))
        """, _env(NBTRAIN_HOME=str(nbtrain_home), HOME=str(user_home)), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [], "import nbtrain changed these environment variables"
    assert list(nbtrain_home.rglob("*")) == []
    assert list(user_home.rglob("*")) == []


@pytest.mark.quick
def test_ray_takes_per_connection_metadata():
    """The private seam nbtrain relies on: ``ray.init(..., _metadata=...)`` hands it to Ray Client."""
    from ray.client_builder import ClientBuilder

    metadata = [("authorization", "Bearer abc")]
    builder = ClientBuilder("127.0.0.1:1")
    builder._init_args(_metadata=metadata)
    assert builder._metadata == metadata, (
        "this Ray no longer takes ray.init(_metadata=...); "
        "nbtrain/_client/connecting/auth.py must send the token another way")


@pytest.mark.quick
def test_importing_ray_builds_no_iri_grammar(tmp_path: Path):
    """nbtrain pins jsonschema below 4.25: from 4.25 on, ``import ray`` (through jsonschema's format
    checkers) imports rfc3987-syntax, which builds ~35 Earley parsers, 1.4 s in every Ray process here."""
    result = _python("""
        import sys, time
        started = time.perf_counter()
        import ray
        print(sorted(name for name in sys.modules if name.startswith("rfc3987_syntax")), time.perf_counter() - started)
        """, _env(), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    grammars, seconds = result.stdout.splitlines()[-1].rsplit(" ", 1)
    assert grammars == "[]", f"import ray took {float(seconds):.2f} s and imported {grammars}: is jsonschema >= 4.25?"


def _client_address() -> str:
    """The session cluster's Ray Client address (the session itself joined it as a driver)."""
    info = local_cluster.status()
    assert info is not None
    return info.address


@pytest.mark.timeout(300)
def test_the_token_travels_in_metadata_alone_and_a_wrong_one_is_refused(cluster, tmp_path: Path):
    """Plain Ray in a process with Ray's token mode off: only ``_metadata`` can carry the token.

    The right token runs an actor and moves an object (unary calls and the data
    stream); a wrong one through the same seam is refused. Ray Client tries a refused
    connection 3 times, waiting 5, 10 and 15 s in between; the wrong one's waits are
    cut to 1 s with Ray's own variables.
    """
    script = """
        import sys
        import ray
        from ray._raylet import AuthenticationMode, get_authentication_mode
        assert get_authentication_mode() == AuthenticationMode.DISABLED, "Ray itself would send a token"
        token = open(sys.argv[2]).read().strip() if sys.argv[2] != "-" else "not-the-token"
        try:
            ray.init(sys.argv[1], _metadata=[("authorization", f"Bearer {token}")], log_to_driver=False,
                     logging_level="ERROR")
        except ConnectionError as exc:
            print("REFUSED", exc)
            sys.exit(3)

        @ray.remote(num_cpus=0)
        class Doubler:
            def double(self, blob):
                return 2 * len(blob)

        doubler = Doubler.remote()
        print("RESULT", ray.get(doubler.double.remote(ray.put(b"x" * 1_000_000))))
        ray.kill(doubler)
        ray.shutdown()
    """
    env = _env(HOME=str(tmp_path))
    quick_retries = {**env, "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}
    client_address = _client_address()
    wrong = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), client_address, "-"], env=quick_retries,
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL)
    try:
        right = subprocess.run([sys.executable, "-c", textwrap.dedent(script), client_address, _token_file()],
                               env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                               stdin=subprocess.DEVNULL)
        wrong_out, _ = wrong.communicate(timeout=240)
    finally:
        wrong.kill()
    assert right.returncode == 0 and "RESULT 2000000" in right.stdout, right.stdout + right.stderr
    assert wrong.returncode == 3 and "REFUSED" in wrong_out, wrong_out


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_notebook_that_imports_ray_first_trains_under_plain_nbclient(cluster, tmp_path: Path):
    """The kernel sees no RAY_AUTH_* variable; the process running nbclient never imports nbtrain."""
    import nbformat

    name = f"ray-first-{uuid.uuid4().hex[:6]}"
    cells = [
        "import ray",
        f"import nbtrain\nnbtrain.connect({cluster.address!r})",
        textwrap.dedent(f"""\
            def train(config):
                nbtrain.report(loss=0.25)

            run = nbtrain.launch(train, workers=1, name={name!r})
            state = run.wait(timeout=300)
            assert state == "succeeded", (state, run.error)
            assert [row["loss"] for row in run.metrics if "loss" in row] == [0.25], run.metrics
            assert "RAY_AUTH_MODE" not in __import__("os").environ
            print("RUN", state)"""),
    ]
    path = tmp_path / "ray_first.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    runner = f"""
        import sys
        import nbformat
        from nbclient import NotebookClient

        notebook = nbformat.read({str(path)!r}, as_version=4)
        try:
            NotebookClient(notebook, timeout={NOTEBOOK_TIMEOUT_S}, kernel_name="python3",
                           resources={{"metadata": {{"path": {str(tmp_path)!r}}}}}).execute()
        finally:
            nbformat.write(notebook, {str(path)!r})
        assert "nbtrain" not in sys.modules and "ray" not in sys.modules
        print("".join(output.get("text", "") for output in notebook.cells[-1].outputs))
        """
    result = _python(runner, _env(), cwd=tmp_path, timeout=NOTEBOOK_TIMEOUT_S + 120)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert "RUN succeeded" in result.stdout, result.stdout


@pytest.mark.timeout(300)
def test_connect_works_with_ray_token_mode_on_in_the_kernel(cluster, tmp_path: Path):
    """A kernel whose Ray has token mode on and another cluster's token: ours is sent first and wins."""
    result = _python(f"""
        import ray
        import nbtrain
        cluster = nbtrain.connect({cluster.address!r}, progress=lambda message: None)
        print("NODES", len(cluster.nodes()))
        """, _env(HOME=str(tmp_path), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64), cwd=tmp_path)
    assert result.returncode == 0 and "NODES" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.timeout(300)
def test_ray_token_mode_on_without_any_token_is_named_fast(cluster, tmp_path: Path):
    """Ray Client would refuse before sending anything; nbtrain says so instead of Ray's error."""
    result = _python(f"""
        import ray
        import nbtrain
        try:
            nbtrain.connect({_client_address()!r}, progress=lambda message: None)
        except nbtrain.ConnectionFailedError as exc:
            print("ERROR", exc)
        """, _env(HOME=str(tmp_path), RAY_AUTH_MODE="token"), cwd=tmp_path, timeout=120)
    assert "Ray in this kernel has token authentication on" in result.stdout, result.stdout + result.stderr[-4000:]
