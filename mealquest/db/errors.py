"""The errors every driver raises, so that code above the database catches one set.

`StoreUnavailable` and its kinds mean "try again later" (503 with
`Retry-After` over HTTP); which kind a caller gets says what happened:

* `StoreBusy`: the database stayed locked, or its server answered nothing,
  past the deadline; nothing of the write was committed;
* `StorageFault`: the storage refused the operation (a full disk, a
  read-only file, an I/O error); nothing was committed;
* `WriteOutcomeUnknown`: the write's answer never came; it may still commit
  (`StoreWriterUnresponsive` on SQLite);
* `StoreBroken`: no write of this process can ever succeed again
  (`StoreWriterDied` on SQLite); the process must be restarted.
"""

from __future__ import annotations

from mealquest.documented import DocumentedError


class StoreError(DocumentedError):
    """The store failed."""


class StoreUnavailable(StoreError):
    """The database cannot be used now; try again later."""

    # Seconds a client is asked to wait before trying again (HTTP Retry-After).
    retry_after = 1


class StoreBusy(StoreUnavailable):
    """The database stayed locked past the deadline; nothing was written; try again later."""


class StorageFault(StoreUnavailable):
    """The database's storage refused the operation; nothing was written; try again later.

    `name` is the database's own name for the error (`SQLITE_FULL`,
    `SQLITE_IOERR_WRITE`, ...) and `reason` a few words for it ("disk full"):
    both safe to log and show, unlike the database's message, which is not
    carried.
    """

    retry_after = 5

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"storage fault: {reason} ({name})")
        self.name = name
        self.reason = reason

    @property
    def disk_full(self) -> bool:
        return self.name == "SQLITE_FULL"


class WriteOutcomeUnknown(StoreUnavailable):
    """The write's answer did not come by the deadline; it may still commit."""

    retry_after = 5


class StoreWriterUnresponsive(WriteOutcomeUnknown):
    """The store's writer thread gave no answer by the deadline; the write may still commit."""


class StoreBroken(StoreUnavailable):
    """No write of this process can succeed any more; restart it."""

    retry_after = 5


class StoreWriterDied(StoreBroken):
    """The store's writer thread died: no write of this process can succeed; restart it."""


class StoreUsedAcrossFork(StoreError):
    """A store opened in one process was used in another (after fork); open a new one."""


class DatabaseURLError(StoreError):
    """The database URL is not one this service can use."""
