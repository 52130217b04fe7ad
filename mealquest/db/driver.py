"""The one storage interface everything above the database is written against.

A driver is a store with its SQL: `mealquest.store.Store` for SQLite (the
embedded default) and `mealquest.db.postgresql.store.PostgresStore` for
PostgreSQL (several hosts, one database). The runner, the API, the CLI,
households, recipes and health call only what `Store` lists here, and each
driver's `jobs`, `households`, `recipes`, `operators`, `sessions` and
`operations` modules have the same functions with the same meaning; a
conformance suite runs them against both.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from types import ModuleType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class Store(Protocol):
    """What code above the database may use, and why each is there."""

    name: str
    """`sqlite` or `postgresql`: for logs and for tests that only one driver can run."""

    writes_one_at_a_time: bool
    """Whether the database runs write transactions one after another (SQLite),
    so that one may also claim jobs (`jobs.claim`) without any lock order to
    keep: the enqueue of this process's pool then claims in its own
    transaction. With concurrent writers (PostgreSQL) a claim added to another
    transaction could deadlock against the completer's, so it claims alone."""

    @property
    def jobs(self) -> ModuleType:
        """The job queue's statements: insert, claim, publish, transition (every
        state change a worker makes), renew, interrupt, rescue, and the reads."""

    @property
    def households(self) -> ModuleType:
        """Households and the digests of their tokens."""

    @property
    def recipes(self) -> ModuleType:
        """Recipes that jobs imported."""

    @property
    def periodic(self) -> ModuleType:
        """Scheduled times of periodic kinds that made their job (one each), and
        the database's clock they are judged by."""

    @property
    def retention(self) -> ModuleType:
        """Deleting finished jobs, a small batch per call."""

    @property
    def operators(self) -> ModuleType:
        """Operators (who watch and steer the queue) and the digests of their tokens."""

    @property
    def sessions(self) -> ModuleType:
        """The dashboard's sign-ins, kept on the server by the digest of their id."""

    @property
    def operations(self) -> ModuleType:
        """The operator's views and actions across households: queue figures,
        retry and delete."""

    @property
    def migrations(self) -> ModuleType:
        """The driver's migration runner: `MIGRATIONS_DIR` and `require_current_of`."""

    def write(self, fn: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(tx, ...)` as one transaction: all of it commits or none. The
        only way anything is written, so that no transaction spans a greenlet
        switch and a deadline bounds every wait."""

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the pure read `fn(conn, ...)`; it may run more than once."""

    def data_version(self) -> int:
        """A number that changes when another process may have committed: the
        idle producer's cheap filter before it looks for a due job."""

    def change_marker(self) -> Hashable | None:
        """A value equal to an earlier one only if nothing has committed since
        that one was taken, from any connection, process or host; None when the
        database has no cheap way to tell (every read then goes to it). What
        lets `ReadCache` answer a read again without a stale answer."""

    def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write can commit now (for /healthz)."""

    @property
    def broken(self) -> bool:
        """Whether no write can ever succeed in this process again (restart it)."""

    def describe(self) -> str:
        """The database as messages may name it (never a password)."""

    def exists(self) -> bool:
        """Whether there is a database to migrate-check (a missing file is not created)."""

    def upgrade(self, target: int | None = None) -> list[Any]:
        """Apply pending migrations; the migrations applied."""

    def migration_status(self) -> Any:
        """The ledger: applied, pending and unknown migrations."""

    def close(self) -> None:
        """Close this process's connections."""
