"""The live processes: each job pool's entry in the database's registry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessEntry:
    """One pool's process as it registered itself: where it runs (`host`,
    `pid`), what it runs (`kinds`, `slots`), how busy it was at its last
    renewal, and when it started and was last seen (fixed-width UTC text, as
    every time is stored). `owner` is the pool's random boot id."""

    owner: str
    host: str
    pid: int
    kinds: tuple[str, ...]
    slots: int
    busy: int = 0
    started_at: str = ""
    last_seen_at: str = ""
