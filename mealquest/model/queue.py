"""Queue figures for operators, as the drivers read them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DueJob:
    """The oldest queued job of a kind whose time has come, and how long it has waited."""

    job_id: str
    kind: str
    age_seconds: float


@dataclass(frozen=True)
class QueueFigures:
    """`counts` by (kind, status); `oldest_due` by kind; jobs finished in the
    last hour; the kinds paused for the whole deployment."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_due: dict[str, DueJob] = field(default_factory=dict)
    finished_last_hour: int = 0
    paused: tuple[str, ...] = ()
    # Queued jobs waiting for their household's answer, and the seconds until
    # the soonest of those waits times out (None: none waits).
    waiting_for_household: int = 0
    next_wait_timeout_seconds: float | None = None

    def by_status(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_kind, status), count in self.counts.items():
            totals[status] = totals.get(status, 0) + count
        return totals

    def kinds(self) -> list[str]:
        return sorted({kind for kind, _status in self.counts})

    def oldest(self) -> DueJob | None:
        """The oldest due job of any kind."""
        return max(self.oldest_due.values(), key=lambda due: due.age_seconds, default=None)


@dataclass(frozen=True)
class Standing:
    """A queued job's place in the claim order, as the driver read it.

    `position`: the due jobs claims take before it (at most the `at_most`
    the read was asked for, which then means that many or more);
    `ahead_in_household`: how many of those are its household's;
    `kind_running`: the running jobs of its kind (for a deployment-wide cap);
    `now`: the database's clock when it was read (fixed-width UTC text)."""

    position: int
    ahead_in_household: int
    kind_running: int
    now: str
