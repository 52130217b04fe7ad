"""Telling a run of storage failures once, not once per caller."""

from __future__ import annotations

import logging
import time

from mealquest.db.errors import StoreUnavailable

logger = logging.getLogger(__name__)

# While a run of storage faults lasts, how often it is reported again.
_FAULT_REPORT_SECONDS = 60.0


class FaultLog:
    """One run of failures of reads or of writes, told once, not once per caller.

    ERROR when it starts, a WARNING with the count every minute while it lasts
    and one when it ends. Used in greenlets only, never the writer thread.
    """

    def __init__(self, what: str) -> None:
        self.what = what  # "writes" or "reads"
        self.since: float | None = None
        self.refused = 0
        self._reported_at = 0.0

    def failed(self, error: StoreUnavailable) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = self._reported_at = now
            self.refused = 1
            logger.error(
                "store: %s fail: %s; refusing them as unavailable until that clears",
                self.what,
                str(error).rstrip("."),
            )
            return
        self.refused += 1
        if now - self._reported_at >= _FAULT_REPORT_SECONDS:
            self._reported_at = now
            logger.warning(
                "store: %s still failing (%s): %d refused in %.0fs",
                self.what,
                str(error).rstrip("."),
                self.refused,
                now - self.since,
            )

    def ended(self) -> None:
        assert self.since is not None
        logger.warning(
            "store: %s work again after %.1fs; %d refused meanwhile",
            self.what,
            time.monotonic() - self.since,
            self.refused,
        )
        self.since = None
        self.refused = 0
