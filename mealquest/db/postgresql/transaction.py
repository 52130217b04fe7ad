"""A PostgreSQL write transaction: one pooled connection between BEGIN and COMMIT."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from mealquest.db.driver import Transaction
from mealquest.db.postgresql.notify import Notifier

if TYPE_CHECKING:
    import psycopg


class PostgresTransaction:
    """An open write transaction on one pooled connection.

    Callbacks given to `after_commit` run in the calling greenlet once the
    transaction has committed (the pool's wake event is signalled there).
    """

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], notifier: Notifier) -> None:
        self.conn = conn
        self.notifier = notifier
        self.after_commit_callbacks: list[Callable[[], None]] = []

    def execute(self, sql: Any, params: Any = None, /) -> psycopg.Cursor[dict[str, Any]]:
        return self.conn.execute(sql, params)

    def after_commit(self, callback: Callable[[], None], /) -> None:
        self.after_commit_callbacks.append(callback)

    def notify_changed(self, job_ids: Iterable[str]) -> bool:
        """Name the jobs this transaction changed to listening processes' stream
        watchers (rate-limited as enqueues are: see `Notifier`)."""
        return self.notifier.changed(self, job_ids)

    def notify_enqueued(self) -> bool:
        """Tell listening processes, when this transaction commits, that a job was
        enqueued (at most one NOTIFY per interval and process: see `Notifier`)."""
        return self.notifier.enqueued(self)


def postgres_transaction(tx: Transaction) -> PostgresTransaction:
    """`tx` as the PostgreSQL transaction it is: this driver's statements run
    only inside its own store's transactions."""
    if not isinstance(tx, PostgresTransaction):
        raise TypeError("a PostgreSQL statement ran outside a PostgreSQL transaction")
    return tx
