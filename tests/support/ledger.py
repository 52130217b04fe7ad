"""Databases in the states a rolling deploy leaves them: migrated by a newer
release than the code under test, or by another history."""

from __future__ import annotations

import sqlite3

from mealquest.db import migrations
from mealquest.db.sqlite import migrate


def add_migration_row(path: str, version: int, name: str) -> str:
    """Record migration `version` as applied without running anything, as a
    release this code does not know would have; returns its `NNNN_name`."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
            "VALUES (?, ?, 'unknown', '2030-01-01T00:00:00.000000Z')",
            (version, name),
        )
    finally:
        conn.close()
    return f"{version:04d}_{name}"


def add_newer_migration(path: str) -> str:
    """The next release's migration, numbered after every one this code has."""
    newest = max(m.version for m in migrations.discover(migrate.MIGRATIONS_DIR))
    return add_migration_row(path, newest + 1, "next_release")
