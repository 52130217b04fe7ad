"""Rescues as a rescuer makes them, with its clock in the test's hands.

A rescuer takes a lease only once it has read it unrenewed for a whole lease
of its own clock, and the database's clock says it expired: `rescue_all`
is the rescue of one that has watched every running lease that long.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from mealquest.db.driver import Store
from mealquest.jobs.runner.rescuer import Rescuer
from mealquest.model.jobs import Lease, Recovered
from tests.support.ticks import Ticks


def watched_rescuer(store: Store, lease_seconds: float = 1.0, keep: Iterable[Lease] = ()):
    """A rescuer on a clock of the test's (`rescuer.clock.advance(...)`)."""
    kept = list(keep)
    return Rescuer(store, lease_seconds, keep=lambda: kept, clock=Ticks())


def rescue_all(store: Store, now: datetime | None = None, keep: Iterable[Lease] = ()) -> Recovered:
    """What a rescuer that has watched every running lease for a whole lease,
    unrenewed, takes at `now` (the database's clock; None: its own)."""
    rescuer = watched_rescuer(store, keep=keep)
    rescuer.run_once(now)  # the first look
    rescuer.clock.advance(rescuer.lease_seconds)
    return rescuer.run_once(now)
