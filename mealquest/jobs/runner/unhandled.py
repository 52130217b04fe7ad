"""Says in the log which queued jobs no handler of this process runs."""

from __future__ import annotations

import logging

from mealquest.db.driver import Store
from mealquest.jobs.registry import Registry

logger = logging.getLogger(__name__)


class UnhandledKinds:
    """Queued jobs of kinds this process has no handler for stay queued (a newer
    process may know them); this says how many wait, and of which kinds."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    def run_once(self) -> dict[str, int]:
        waiting = self.store.read(self.store.jobs.queued_of_other_kinds, self.registry.names())
        if waiting:
            listed = ", ".join(f"{kind} ({count})" for kind, count in waiting.items())
            logger.warning(
                "%d queued jobs wait for kinds no handler here runs: %s",
                sum(waiting.values()),
                listed,
            )
        return waiting
