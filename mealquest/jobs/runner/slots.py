"""The pool's slots: where handlers run, which jobs are in them, and what claims may fill.

A slot is a place in a `gevent.pool.Pool`: it frees only when the job's
greenlet is dead, so a handler that will not die keeps its slot (and the
watchdog restarts the process) instead of running beside the job's next
attempt. A claim in flight reserves the slots it may fill (and, of those,
how many with each capped kind) until its jobs are placed, so two claims
never count the same free slot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import gevent.pool
from gevent.event import Event
from gevent.greenlet import Greenlet

from mealquest.jobs.runner.running import Running
from mealquest.model.jobs import Lease


class Slots:
    """One pool's `size` slots and the jobs running in them."""

    def __init__(self, size: int) -> None:
        # By lease: a job taken from a handler that has not died yet may be
        # claimed again here under a new lease.
        self.running: dict[Lease, Running] = {}
        # How many of them are attempts at each job: one, but for a job
        # another process took back that this one claimed again while the
        # earlier attempt's handler lives (`attempts_at`).
        self._attempts: Counter[str] = Counter()
        # Set whenever a slot may have become free (a greenlet ended, or a
        # claim filled fewer slots than it reserved).
        self.freed = Event()
        self._greenlets = gevent.pool.Pool(size)
        self._reserved = 0
        self._reserved_kinds: Counter[str] = Counter()

    def free(self) -> int:
        """Slots neither running a greenlet nor reserved by a claim in flight."""
        return int(self._greenlets.free_count()) - self._reserved

    def kind_room(
        self, caps: Mapping[str, int], finishing: Counter[str] | None = None
    ) -> dict[str, int]:
        """How many more jobs of each capped kind this process may start: its cap
        less the jobs of the kind it runs (a greenlet not dead yet counts),
        less what claims in flight may bring, plus `finishing` (jobs whose
        handlers returned and whose outcomes the claiming transaction writes)."""
        running = Counter(entry.job.kind for entry in list(self.running.values()))
        finishing = finishing or Counter()
        return {
            kind: max(0, cap - running[kind] - self._reserved_kinds[kind] + finishing[kind])
            for kind, cap in caps.items()
        }

    @contextmanager
    def reserving(self, slots: int, kinds: Mapping[str, int] | None = None) -> Iterator[None]:
        """Hold `slots` (and up to `kinds[kind]` of each capped kind) for a claim in flight."""
        kinds = dict(kinds or {})
        self._reserved += slots
        self._reserved_kinds.update(kinds)
        try:
            yield
        finally:
            self._reserved -= slots
            self._reserved_kinds.subtract(kinds)
            if slots:
                # A claim that took fewer jobs than it reserved leaves slots
                # free that no ending greenlet will announce.
                self.freed.set()

    def claims_in_flight(self) -> bool:
        """Whether a claim has reserved slots and not yet placed its jobs."""
        return self._reserved > 0

    def place(self, entry: Running, run: Callable[[Running], None]) -> None:
        """Run `run(entry)` in a slot of its own (waiting for one to free), as
        one of the running jobs until its greenlet is dead."""
        self.running[entry.lease] = entry
        self._attempts[entry.job.id] += 1
        greenlet = Greenlet(run, entry)
        entry.greenlet = greenlet
        greenlet.rawlink(lambda _: self._ended(entry))
        self._greenlets.start(greenlet)

    def _ended(self, entry: Running) -> None:
        if self.running.get(entry.lease) is entry:
            del self.running[entry.lease]
            self._attempts[entry.job.id] -= 1
            if not self._attempts[entry.job.id]:
                del self._attempts[entry.job.id]
        self.freed.set()

    def attempts_at(self, job_id: str) -> int:
        """How many of the running jobs are attempts at `job_id`, at once
        (every job's start asks: a scan of every slot was a job's cost)."""
        return self._attempts[job_id]

    def greenlets(self) -> list[Greenlet]:
        return list(self._greenlets)

    def job_of(self, greenlet: object) -> Running | None:
        """The job a greenlet runs (for the hub monitor, from its own thread: reads only)."""
        for entry in list(self.running.values()):
            if entry.greenlet is greenlet:
                return entry
        return None

    def alive(self) -> list[Running]:
        """The jobs whose handlers' greenlets still run."""
        return [entry for entry in list(self.running.values()) if entry.alive()]
