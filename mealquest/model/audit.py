"""The operators' audit log as the drivers read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AuditEntry:
    """One operator action: who, what (`action` on `target`), how many jobs or
    rows it touched, and when (`at`, fixed-width UTC text)."""

    seq: int
    at: str
    operator_id: int | None
    actor: str
    action: str
    target: str
    count: int
