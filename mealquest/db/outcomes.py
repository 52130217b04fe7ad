"""What both drivers' batched outcome writes share: which transitions go in one statement.

The completer records the outcomes of the jobs that finished together by
one statement (`transition_many`). A statement moves each job row once
and answers which jobs it moved, not by which lease, so a job named more
than once in a batch (a stale lease of it beside its current one) is
written lease by lease, in order, as `transition` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from mealquest.db.driver import Transaction
from mealquest.model.jobs import Transition, check_transition

# Writes transitions that each name another job, in one statement, in the
# transaction given; the ids of the jobs it moved.
WriteTogether = Callable[[Transaction, list[Transition]], set[str]]
# The driver's `transition`: one job's move; whether its lease was still held.
WriteOne = Callable[[Transaction, Transition], bool]


def transition_many(
    tx: Transaction,
    transitions: Sequence[Transition],
    together: WriteTogether,
    transition: WriteOne,
) -> list[bool]:
    """Whether each transition's lease was still held: the jobs named once
    written by `together` (when there are two or more of them), any other
    by `transition`, in order."""
    for change in transitions:
        check_transition(change.to, change.attempt, change.snoozed)
    named = Counter(change.lease.job_id for change in transitions)
    once = [change for change in transitions if named[change.lease.job_id] == 1]
    moved = together(tx, once) if len(once) > 1 else set()
    return [
        change.lease.job_id in moved
        if len(once) > 1 and named[change.lease.job_id] == 1
        else transition(tx, change)
        for change in transitions
    ]
