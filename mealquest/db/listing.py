"""Which index serves a household's list of its jobs, whatever its filters.

A household's list must cost the same whether the table holds none or
millions of other households' jobs, so each filter is served by an index
that starts with the household (migrations `household_lists`): by kind,
through (household_id, kind, seq); by a final status, through
(household_id, status, seq) of finished jobs; queued and running jobs
through their partial indexes, which the quota keeps small per household;
otherwise (household_id, seq). The index's own condition is added to the
statement as written, so that SQLite, which takes a partial index only for
a statement that says its condition, can use it.
"""

from __future__ import annotations

from mealquest.model.jobs import FINAL_STATUSES, Status

_FINISHED = "status IN (" + ", ".join(f"'{status}'" for status in FINAL_STATUSES) + ")"


def household_index(status: Status | None, kind: str | None) -> tuple[str, str | None]:
    """The index of a household's list with these filters, and the condition
    to add to the statement for it (None: none)."""
    if kind is not None:
        return "jobs_household_kind", None
    if status is Status.QUEUED:
        return "jobs_household_queued", "status = 'queued'"
    if status is Status.RUNNING:
        return "jobs_running", "status = 'running'"
    if status is not None:
        return "jobs_household_finished", _FINISHED
    return "jobs_household", None
