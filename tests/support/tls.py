"""A self-signed certificate for the TLS tests, made by the openssl command line,
and a client context that trusts it (and nothing else).

One certificate per test process, in a folder of its own removed at exit. It
names 127.0.0.1 (where the test servers listen) and `TEST_HOST`, the name a
client may send as its `Host` as a browser on the default port would.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

TEST_HOST = "api.mealquest.example"


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path


@functools.cache
def certificate() -> Certificate:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise AssertionError(
            "the openssl command is missing: `scripts/test` installs it from Debian's packages"
        )
    # Readable by nginx's own user too, whoever runs the test.
    directory = Path(tempfile.mkdtemp(prefix="mq-tls-"))
    directory.chmod(0o755)
    atexit.register(shutil.rmtree, directory, True)
    made = Certificate(directory / "cert.pem", directory / "key.pem")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            f"subjectAltName=IP:127.0.0.1,DNS:{TEST_HOST}",
            "-keyout",
            str(made.key),
            "-out",
            str(made.cert),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return made


def client_context() -> ssl.SSLContext:
    """Verifies the server's certificate against the test certificate alone."""
    return ssl.create_default_context(cafile=str(certificate().cert))
