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

    def __init__(self, standby_of: PrivateServer | None = None) -> None:
        # Directly under the temp folder: the server's own user must reach it.
        self.directory = tempfile.mkdtemp(prefix="mq-pg-")
        if standby_of is None:
            self.url = self.run("start")
        else:
            # A streaming standby of that server (pg_basebackup -R), started.
            self.url = self.run("standby", standby_of.directory)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def run(self, command: str, *arguments: str) -> str:
        """`scripts/postgres COMMAND DIR [ARGUMENT]`; its output (the URL, for
        `start` and `standby`)."""
        done = subprocess.run(
            [str(self.SCRIPT), command, self.directory, *arguments],
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
