"""A small tmpfs a test mounts, fills to the last byte and frees again (needs root)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

_CHUNK = 64 * 1024


class SmallDisk:
    """A tmpfs of `size_bytes` mounted at `path` until `unmount()`.

    `fill()` writes a filler file until the file system refuses (ENOSPC);
    `free()` deletes it, so the space comes back at once.
    """

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self._filler = path / "filler"
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )

    def fill(self) -> None:
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (_CHUNK, 1):  # then byte by byte: nothing is left at all
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        # Lazily if a connection is still open: detached now, gone once closed.
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(self.path)], check=True, capture_output=True)
