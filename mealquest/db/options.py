"""The choices of the drivers' own settings, named where the settings table
and the drivers both find them: SQLite's `PRAGMA synchronous` modes, and how
PostgreSQL is reached (directly, or through a pooler that hands out a
server connection per transaction)."""

from __future__ import annotations

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
POOLERS = ("none", "transaction")
