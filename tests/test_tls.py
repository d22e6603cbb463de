"""Ray's own TLS between the notebook and the cluster (``RAY_USE_TLS=1`` and its three files).

An embedded cluster is started with TLS on, its certificates made here by a CA of the test's own
(a real cluster would use the operator's). A script with the same variables connects, trains two
ranks and reads the result; a script without them is told, within seconds, that the server speaks
TLS and which variables to set; a script with TLS on and a file missing is told which one.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from nbtrain._client.connecting import tls

TRAIN = '''
import json, nbtrain

def train(config):
    nbtrain.report(step=1, loss=0.5)
    return nbtrain.get_context().rank

nbtrain.connect(progress=lambda message: None)
run = nbtrain.launch(train, workers=2, name="over-tls")
print(json.dumps({"state": run.wait(timeout=180).value, "result": run.result,
                  "loss": [row["loss"] for row in run.metrics]}))
'''

CONNECT = '''
import json, time, nbtrain
started = time.monotonic()
try:
    nbtrain.connect(progress=lambda message: None)
    said = "connected"
except nbtrain.ConnectionFailedError as exc:
    said = str(exc)
print(json.dumps({"said": said, "seconds": time.monotonic() - started}))
'''


def make_certificates(folder: Path) -> dict[str, str]:
    """A CA and a certificate for 127.0.0.1 it signed, as ``RAY_TLS_*`` variables (Ray uses one pair
    for its servers and its clients)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nbtrain test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {"RAY_TLS_CA_CERT": ("ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
             "RAY_TLS_SERVER_CERT": ("cert.pem", cert.public_bytes(serialization.Encoding.PEM)),
             "RAY_TLS_SERVER_KEY": ("key.pem", key.private_bytes(serialization.Encoding.PEM,
                                                                 serialization.PrivateFormat.PKCS8,
                                                                 serialization.NoEncryption()))}
    variables = {}
    for variable, (name, content) in files.items():
        (folder / name).write_bytes(content)
        variables[variable] = str(folder / name)
    return variables


def run_script(source: str, env: dict[str, str], cwd: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_cluster_with_rays_tls_trains_for_a_notebook_with_it_and_names_the_variables_to_one_without(
        tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="nbt-tls-"))  # short: Ray's socket paths live under it
    certificates = make_certificates(tmp_path)
    plain = {key: value for key, value in os.environ.items()
             if key not in {"RAY_ADDRESS", "RAY_ENABLE_AUTO_CONNECT", tls.USE_TLS, *tls.TLS_FILES}}
    plain["NBTRAIN_HOME"] = str(home)
    with_tls = {**plain, tls.USE_TLS: "1", **certificates}
    try:
        started = subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "start", "--num-cpus", "2"],
                                 env=with_tls, capture_output=True, text=True, timeout=240, check=False)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        port = int(json.loads((home / "cluster" / "local.json").read_text())["client_port"])
        assert tls.server_speaks_tls("127.0.0.1", port, 3.0)

        trained = run_script(TRAIN, with_tls, tmp_path)
        assert trained == {"state": "succeeded", "result": [0, 1], "loss": [0.5, 0.5]}

        refused = run_script(CONNECT, plain, tmp_path)
        said = str(refused["said"])
        assert "speaks TLS" in said and "RAY_USE_TLS=1" in said and "RAY_TLS_CA_CERT" in said, said
        assert float(str(refused["seconds"])) < 15

        missing = {key: value for key, value in with_tls.items() if key != "RAY_TLS_SERVER_KEY"}
        said = str(run_script(CONNECT, missing, tmp_path)["said"])
        assert "RAY_TLS_SERVER_KEY is not set" in said, said
    finally:
        subprocess.run([sys.executable, "-m", "nbtrain", "cluster", "stop"], env=with_tls, capture_output=True,
                       timeout=120, check=False)
        shutil.rmtree(home, ignore_errors=True)
