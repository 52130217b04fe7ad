"""The migration ledger both drivers keep: plain SQL files, applied in order, each once.

Each driver has its files (`migrations/sqlite/`, `migrations/postgresql/`)
and applies them its own way (`mealquest.db.sqlite.migrate`,
`mealquest.db.postgresql.migrate`), recording each in its
`schema_migrations` table (version, name, checksum, time). What the
ledger means is the same for both, and decided here: an applied file whose
checksum changed is refused rather than skipped, and so is a history this
code does not share.

`upgrade` runs in the foreground (Flask CLI, before gunicorn starts), so it
uses a plain connection that may wait on locks. Serving processes check the
database with `require_migrated`, through their store, once.

A database may be *ahead* of the code: in a rolling deploy the new release's
`flask db upgrade` runs while the old release still serves, and old workers
restart (SIGHUP, `max_requests`, a crash) before the new code replaces them.
Such a database is served, with a warning naming the migrations this code
does not know, because a release's migrations are written so that the
previous release keeps working. It is accepted only in the shape a newer
release of this same code leaves: every migration this code knows applied,
and the unknown ones numbered above all of them. An unknown migration
numbered below one this code knows (a gap), or one applied while a known one
is still pending, cannot come from a newer release: the database and the
code have different histories, and that is refused like a changed checksum.
A database *behind* the code (pending migrations) is refused with the
command to run.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mealquest.db.errors import StoreError

logger = logging.getLogger(__name__)

MIGRATIONS_ROOT = Path(__file__).resolve().parent.parent.parent / "migrations"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(StoreError):
    """A migration could not be applied; the database is at the previous version."""


class DatabaseNotMigrated(MigrationError):
    """The database is behind the code's migrations: run `flask db upgrade`."""

    def __init__(self, message: str | None = None, pending: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.pending = tuple(pending)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str


@dataclass(frozen=True)
class AppliedMigration:
    """A row of a database's `schema_migrations`, as its driver reads it."""

    name: str
    checksum: str
    applied_at: str


@dataclass(frozen=True)
class MigrationState:
    migration: Migration
    applied_at: str | None

    @property
    def applied(self) -> bool:
        return self.applied_at is not None


@dataclass(frozen=True)
class Ledger:
    """What a database has applied, as this code sees it."""

    states: tuple[MigrationState, ...]
    """Every migration this code knows, applied or pending, in order."""
    unknown: tuple[str, ...] = ()
    """Applied migrations this code does not know (`NNNN_name`), all newer than its own."""

    @property
    def pending(self) -> tuple[Migration, ...]:
        return tuple(state.migration for state in self.states if not state.applied)


def discover(directory: Path) -> list[Migration]:
    """The migration files of `directory`, in order, each with its checksum."""
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file name not NNNN_name.sql: {path.name}")
        checksum = hashlib.sha256(path.read_bytes()).hexdigest()
        migrations.append(Migration(int(match[1]), match[2], path, checksum))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version number")
    return migrations


def ledger_of(migrations: list[Migration], applied: Mapping[int, AppliedMigration]) -> Ledger:
    """Every known migration with when it was applied, and the newer unknown
    ones; refuses changed applied files and a history this code does not share."""
    unknown = check_ledger(migrations, applied)
    states = tuple(
        MigrationState(m, applied[m.version].applied_at if m.version in applied else None)
        for m in migrations
    )
    return Ledger(states, unknown)


def require_current(ledger: Ledger) -> tuple[str, ...]:
    """Raise DatabaseNotMigrated unless every known migration is applied; returns
    the applied migrations this code does not know (a newer release's)."""
    if ledger.pending:
        names = [m.path.name for m in ledger.pending]
        raise DatabaseNotMigrated(
            f"the database is not migrated ({len(names)} pending: {', '.join(names)}); "
            "run `flask db upgrade`",
            names,
        )
    return ledger.unknown


class Migrated(Protocol):
    """What the serving check reads of a store (every driver's `Store` is one)."""

    @property
    def migrations_dir(self) -> Path: ...

    def describe(self) -> str: ...

    def exists(self) -> bool: ...

    def applied_migrations(self) -> dict[int, AppliedMigration]: ...


# The databases (as described, migrations folder) this process found migrated.
_passed: set[tuple[str, Path]] = set()


@functools.cache
def _known(directory: Path) -> list[Migration]:
    """The code's migrations, read and hashed once per process: its files do
    not change while it runs."""
    return discover(directory)


def require_migrated(store: Migrated, directory: Path | None = None) -> None:
    """Refuse a database behind this code's migrations (DatabaseNotMigrated,
    naming `flask db upgrade`) or with another history (MigrationError); let
    one ahead of it through, logging a WARNING that names what it does not know.

    The one check of every serving path: gunicorn's preflight and workers,
    `flask jobs work`, the CLI's commands, `/healthz`. A pass is remembered
    for the life of the process, per database: migrations are only ever
    added and the code's files do not change while it runs, so later calls
    cost nothing (the warning is logged once). A refusal is not remembered:
    after the operator's `flask db upgrade` the next call passes. Reads
    through `store`, so it never waits on a lock on the hub; a missing file is
    refused without being created. `directory` stands in for the driver's
    own migrations (tests of other histories).
    """
    directory = store.migrations_dir if directory is None else directory
    key = (store.describe(), directory)
    if key in _passed:
        return
    known = _known(directory)
    if not store.exists():
        raise DatabaseNotMigrated(
            f"the database {store.describe()} does not exist; run `flask db upgrade`",
            [m.path.name for m in known],
        )
    try:
        unknown = require_current(ledger_of(known, store.applied_migrations()))
    except DatabaseNotMigrated as error:
        raise DatabaseNotMigrated(
            f"the database {store.describe()} is not migrated ({len(error.pending)} pending: "
            f"{', '.join(error.pending)}); run `flask db upgrade`",
            error.pending,
        ) from None
    if unknown:
        logger.warning(
            "the database %s has migrations this code does not know (%s): serving it "
            "(a newer release applied them; its migrations keep this release working)",
            store.describe(),
            ", ".join(unknown),
        )
    _passed.add(key)


def require_this_version(store: Migrated, directory: Path | None = None) -> None:
    """Refuse a database at any other migration than this code's newest, in
    one line naming both and `flask db upgrade` (MigrationError).

    The check of the one-shot commands (every `flask` command but `flask db
    ...` and the servers): unlike a server in a rolling deploy, an operator's
    command has no reason to run old code against a newer schema, and a
    command of this code on an older one fails half way on a missing column.
    """
    directory = store.migrations_dir if directory is None else directory
    known = _known(directory)
    code_at = f"{known[-1].version:04d}" if known else "none"
    where = store.describe()
    if not store.exists():
        raise DatabaseNotMigrated(
            f"the database {where} does not exist (this code is at migration {code_at}); "
            "run `flask db upgrade`"
        )
    applied = store.applied_migrations()
    db_at = f"{max(applied):04d}" if applied else "none"
    ledger = ledger_of(known, applied)
    if ledger.pending:
        raise DatabaseNotMigrated(
            f"the database {where} is at migration {db_at}, behind this code's {code_at}: "
            "run `flask db upgrade`",
            [m.path.name for m in ledger.pending],
        )
    if ledger.unknown:
        raise MigrationError(
            f"the database {where} is at migration {db_at}, ahead of this code's {code_at} "
            "(a newer release ran `flask db upgrade`): run this command from that release"
        )


def check_ledger(
    migrations: list[Migration], applied: Mapping[int, AppliedMigration]
) -> tuple[str, ...]:
    """Refuse a changed applied file or a history this code does not share;
    return the applied migrations it does not know (all newer than its own)."""
    known = {m.version: m for m in migrations}
    for version, row in applied.items():
        migration = known.get(version)
        if migration is not None and migration.checksum != row.checksum:
            raise MigrationError(
                f"migration {migration.path.name} was changed after it was applied; "
                "add a new migration instead of editing an applied one"
            )
    unknown = sorted(version for version in applied if version not in known)
    if not unknown:
        return ()
    names = [f"{version:04d}_{applied[version].name}" for version in unknown]
    newest = max(known, default=0)
    if unknown[0] < newest:
        raise MigrationError(
            f"the database has migration {names[0]} that this code does not know, numbered "
            f"below its own {known[newest].path.name}: the database and the code have "
            "different migration histories"
        )
    pending = [m.path.name for m in migrations if m.version not in applied]
    if pending:
        raise MigrationError(
            f"the database has migration {names[0]} that this code does not know but not "
            f"its own {', '.join(pending)}: the database and the code have different "
            "migration histories"
        )
    return tuple(names)
