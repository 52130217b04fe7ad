"""The serving tests' app with a route that ends the SQLite store's writer
thread, as a fault of its own would: `POST /test/break-writer`."""

from __future__ import annotations

import sqlite3

from mealquest.extensions import get_store
from tests.support.serving_app import app

# The writer checkpoints in its first pause after this many writes.
_WRITES_BEFORE_A_CHECKPOINT = 100


class _Fatal(BaseException):
    """Ends the writer thread from its idle checkpoint (which catches Exception only)."""


def _break_writer() -> tuple[str, int]:
    store = get_store()

    def sabotage(tx):
        def row_factory(cursor, row):
            if cursor.description[0][0] == "busy":  # PRAGMA wal_checkpoint's row
                raise _Fatal("the writer thread ends")
            return sqlite3.Row(cursor, row)

        tx.conn.row_factory = row_factory

    store.write(sabotage)
    for _ in range(_WRITES_BEFORE_A_CHECKPOINT):
        store.write(lambda tx: tx.execute("SELECT 1").fetchone())
    return "sabotaged", 200


app.add_url_rule("/test/break-writer", "test_break_writer", _break_writer, methods=["POST"])

__all__ = ["app"]
