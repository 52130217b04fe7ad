"""Suspending and resuming a household.

A suspended household's API requests are refused (`403
household_suspended`), from the very next request on any process: the token
check reads the household's state in the statement that checks the token.
Its queued jobs wait: every claim leaves out suspended households' jobs.
Its running jobs finish. Resuming lets both go on.
"""

from __future__ import annotations

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID, SystemHouseholdRefused
from mealquest.model.operators import Operator


def suspend(store: Store, household_id: int, operator: Operator | None) -> bool:
    """Suspend the household; False if it already was (`UnknownHousehold`,
    `HouseholdErased`, `SystemHouseholdRefused` otherwise)."""
    if household_id == SYSTEM_HOUSEHOLD_ID:
        raise SystemHouseholdRefused()

    def write(tx: Transaction) -> bool:
        changed = store.households.suspend_household(tx, household_id)
        audit.insert(tx, store, operator, "suspend", f"household {household_id}", int(changed))
        return changed

    return store.write(write)


def resume(store: Store, household_id: int, operator: Operator | None) -> bool:
    """Lift the household's suspension; False if there was none."""
    if household_id == SYSTEM_HOUSEHOLD_ID:
        raise SystemHouseholdRefused()

    def write(tx: Transaction) -> bool:
        changed = store.households.resume_household(tx, household_id)
        audit.insert(tx, store, operator, "resume", f"household {household_id}", int(changed))
        return changed

    return store.write(write)
