"""The start-up check that psycopg waits cooperatively under gevent.

psycopg chooses how it waits for the server once, when `psycopg.waiting` is
imported: its C function `wait_c` (a blocking poll that gevent cannot
interrupt) unless gevent has already patched `select`, in which case a
pure-Python poll that yields to the hub. psycopg_pool likewise keeps the
`threading` and `time` objects it found at import. A process that imported
either before gevent patched the standard library therefore blocks every
greenlet on each query: one slow query stalls all requests and jobs of the
worker, and gunicorn kills a worker whose hub stays blocked. Nothing fails
loudly, so the serving processes check at start and refuse to run instead.
"""

from __future__ import annotations

import sys
import threading
import time

from gevent import monkey

from mealquest.db.errors import StoreError


class BlockingPsycopg(StoreError):
    """psycopg was imported before gevent patched the standard library, so every query
    would block all greenlets: import it only after monkey-patching (gunicorn's gevent
    worker, `flask jobs work`'s launcher)."""


def psycopg_waits_cooperatively() -> bool:
    """True when psycopg (and psycopg_pool, if loaded) will yield to gevent's hub
    while waiting on the server."""
    if not monkey.is_module_patched("select"):
        return False
    # Imported here, not at the top: importing psycopg is what fixes its choice.
    from psycopg import waiting

    if waiting.wait is getattr(waiting, "wait_c", None):
        return False
    pool_compat = sys.modules.get("psycopg_pool._acompat")
    if pool_compat is not None:
        # The pool's background workers, its waits and its sleeps.
        captured = {
            "Worker": threading.Thread,
            "Event": threading.Event,
            "sleep": time.sleep,
        }
        for name, patched in captured.items():
            if getattr(pool_compat, name, patched) is not patched:
                return False
    return True


def require_cooperative_psycopg() -> None:
    """Raise `BlockingPsycopg` (one line) unless psycopg waits cooperatively."""
    if not psycopg_waits_cooperatively():
        raise BlockingPsycopg()
