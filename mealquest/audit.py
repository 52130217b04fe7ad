"""The operators' audit log: every action an operator takes, with who, what,
how many and when.

One call records an action (`record`); an action done in batches records
itself first and raises its count in each batch's own transaction
(`add`), so the log holds what was done even when the action stops half
way. From the command line there is no signed-in operator: the actor is
"command line" and the system user who ran it. Entries go with the jobs,
after `MEALQUEST_JOB_RETENTION_DAYS` (`mealquest.jobs.service.retention`).

For a new action (a kind paused or resumed, say):

    audit.record(store, operator, "pause", f"kind {kind}")

`operator` is the dashboard's signed-in `Operator`, or None from the CLI.
"""

from __future__ import annotations

import getpass

from mealquest.db.driver import Store, Transaction
from mealquest.model.audit import AuditEntry
from mealquest.model.operators import Operator

# The columns' bounds (see the migration): longer texts are cut.
_MAX_ACTOR = 300
_MAX_ACTION = 64
_MAX_TARGET = 500


def actor_of(operator: Operator | None) -> str:
    """Who an entry says acted: the operator, or the command line's user."""
    if operator is not None:
        return operator.name[:_MAX_ACTOR]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = "unknown user"
    return f"command line ({user})"[:_MAX_ACTOR]


def insert(
    tx: Transaction,
    store: Store,
    operator: Operator | None,
    action: str,
    target: str,
    count: int = 1,
) -> int:
    """Record an action inside the caller's transaction; the entry's seq."""
    return store.audit.insert_entry(
        tx,
        operator_id=None if operator is None else operator.id,
        actor=actor_of(operator),
        action=action[:_MAX_ACTION],
        target=target[:_MAX_TARGET],
        count=max(0, count),
    )


def record(
    store: Store, operator: Operator | None, action: str, target: str, count: int = 1
) -> int:
    """Record an action (`count`: the jobs or rows it touched) in a transaction
    of its own; the entry's seq, for `add`."""
    return store.write(insert, store, operator, action, target, count)


def add(tx: Transaction, store: Store, seq: int, amount: int) -> None:
    """Raise an entry's count by what a batch did, in that batch's transaction."""
    if amount:
        store.audit.add_to_count(tx, seq, amount)


def entries(store: Store, *, before_seq: int | None = None, limit: int = 50) -> list[AuditEntry]:
    """Entries newest first, a page at a time."""
    return store.read(store.audit.list_entries, before_seq=before_seq, limit=limit)
