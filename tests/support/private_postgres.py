"""A PostgreSQL server of a test's own, started by `scripts/postgres`, which the
test may stop, start and restart without disturbing other tests' server."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile

from tests.support.processes import REPO


class PrivateServer:
    SCRIPT = REPO / "scripts" / "postgres"

    def __init__(self) -> None:
        # Directly under the temp folder: the server's own user must reach it.
        self.directory = tempfile.mkdtemp(prefix="mq-pg-")
        self.url = self.run("start")

    def run(self, command: str) -> str:
        """`scripts/postgres COMMAND DIR`; its output (the URL, for `start`)."""
        done = subprocess.run(
            [str(self.SCRIPT), command, self.directory],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def remove(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("stop")
        shutil.rmtree(self.directory, ignore_errors=True)
