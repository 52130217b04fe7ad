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


@dataclass(frozen=True)
class Household:
    id: int
    name: str
