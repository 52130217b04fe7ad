"""gevent's monkey-patching, with the installed distributions read once.

At each of its events (25 in a `patch_all`), gevent looks up its plugins'
entry points, and each lookup (`importlib.metadata.entry_points`) reads the
metadata of every installed distribution. With the 170 of the test
environment, `patch_all` took about 0.5 s of every gevent process's start
(each gunicorn worker, `flask jobs work`, each bench child), and about 0.1 s
with the distributions read once. Nothing installs a distribution while a
process patches, so they are read once for the patch, and `entry_points` is
the standard library's again afterwards.

Imports nothing but the standard library and gevent: it runs before the
patching, when a module-level lock made by anything else would stay a real
OS lock.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any


@contextmanager
def entry_points_read_once() -> Iterator[None]:
    """Inside, `importlib.metadata.entry_points(group=...)` selects from one
    reading of the installed distributions."""
    original = metadata.entry_points
    every = original()

    def entry_points(**params: Any) -> Any:
        return every.select(**params) if params else every

    setattr(metadata, "entry_points", entry_points)  # noqa: B010 - the stdlib's own function
    try:
        yield
    finally:
        setattr(metadata, "entry_points", original)  # noqa: B010


def patch_all() -> None:
    """`gevent.monkey.patch_all()`, its plugin lookups from one reading."""
    from gevent import monkey

    with entry_points_read_once():
        monkey.patch_all()


def main() -> None:
    """`python -m mealquest.gevent_patching MODULE [ARGS]`: MODULE run as
    `python -m MODULE [ARGS]` in a process patched before anything else is
    imported, as `python -m gevent.monkey --module MODULE` does."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m mealquest.gevent_patching MODULE [ARGS]")
    patch_all()
    sys.argv[:] = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
