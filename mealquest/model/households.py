"""Households as the drivers read them, and the refusals of their statements."""

from __future__ import annotations

from dataclasses import dataclass

from mealquest.documented import DocumentedError

# The household periodic jobs (maintenance included) belong to, made by the
# migrations. It never has a token, so no caller of the API is it, and the
# household-scoped API never shows its jobs to anyone.
SYSTEM_HOUSEHOLD_ID = 0


class HouseholdError(DocumentedError):
    """A household or token operation was refused."""


class UnknownHousehold(HouseholdError):
    """No household has that id."""


class UnknownToken(HouseholdError):
    """No token has that id, or it is already revoked."""


class HouseholdErased(HouseholdError):
    """That household was erased: only its id is left."""


class SystemHouseholdRefused(HouseholdError):
    """The system household (periodic jobs) is no one's to suspend or erase."""


@dataclass(frozen=True)
class TokenInfo:
    """A token as `flask tokens list` shows it: never its secret, which is not
    stored (times as fixed-width UTC text, None while not so)."""

    id: int
    name: str | None
    created_at: str
    last_used_at: str | None
    revoked_at: str | None


@dataclass(frozen=True)
class Household:
    id: int
    name: str
    # Its requests are refused and its queued jobs wait (an operator's choice).
    suspended: bool = False


@dataclass(frozen=True)
class HouseholdState:
    """A household as the operators' pages and commands see it (times as
    fixed-width UTC text, None while not so)."""

    id: int
    name: str
    created_at: str
    suspended_at: str | None
    erased_at: str | None


@dataclass(frozen=True)
class HouseholdFigures:
    """A household's jobs by status and its quota's use (queued and running,
    exact). Final statuses are counted among its latest `looked_at` jobs (at
    most the bound the read was given: a household's whole history is not
    walked for a page)."""

    household: HouseholdState
    jobs: dict[str, int]
    looked_at: int
    live_tokens: int

    @property
    def pending(self) -> int:
        return self.jobs.get("queued", 0) + self.jobs.get("running", 0)
