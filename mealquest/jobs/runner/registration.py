"""The pool's entry in the registry of live processes.

Each pool enters its process when it starts (host, pid, the kinds it has
handlers for, its slots), renews the entry at its heartbeat's rhythm with how
many jobs it runs, and removes it when it stops. A process that dies
without stopping leaves its entry unrenewed, and readers count an entry not
renewed for a lease as gone. What reads it: a queued job's `waiting_for`
(`no_worker` when no live process handles its kind), its estimated start
(the slots that serve its kind), and the operators' view of the processes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from mealquest.db.driver import Store
from mealquest.model.processes import ProcessEntry

logger = logging.getLogger(__name__)

# Entries of processes not seen for this long are deleted when a process
# registers (readers already leave them out after a lease).
FORGET_AFTER_SECONDS = 3600.0


class Registration:
    """One pool's entry: `register` at start, `run_once` at each renewal, `remove` at stop."""

    def __init__(
        self,
        store: Store,
        owner: str,
        kinds: Callable[[], tuple[str, ...]],
        slots: int,
        busy: Callable[[], int],
    ) -> None:
        self.store = store
        self.owner = owner
        self.kinds = kinds
        self.slots = slots
        self.busy = busy
        self.registered = False

    def entry(self) -> ProcessEntry:
        return ProcessEntry(
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            kinds=tuple(sorted(self.kinds())),
            slots=self.slots,
            busy=self.busy(),
        )

    def register(self) -> None:
        self.store.write(
            self.store.processes.register_process,
            self.entry(),
            forget_after_seconds=FORGET_AFTER_SECONDS,
        )
        self.registered = True

    def run_once(self) -> bool:
        """Renew the entry (entering it again if it is missing: a registration
        that failed at start, or an entry deleted meanwhile); whether it was
        only renewed."""
        renewed = self.registered and self.store.write(
            self.store.processes.renew_process, self.owner, busy=self.busy()
        )
        if not renewed:
            self.register()
        return renewed

    def remove(self) -> None:
        self.store.write(self.store.processes.remove_process, self.owner)
        self.registered = False
