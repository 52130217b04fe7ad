"""Operators as the drivers read them, and the refusals of their statements."""

from __future__ import annotations

from dataclasses import dataclass

from mealquest.documented import DocumentedError


class OperatorError(DocumentedError):
    """An operator operation was refused."""


class UnknownOperator(OperatorError):
    """No live operator has that id."""


@dataclass(frozen=True)
class Operator:
    id: int
    name: str


@dataclass(frozen=True)
class OperatorListing:
    """An operator as `flask operators list` shows it."""

    id: int
    name: str
    created_at: str
    revoked_at: str | None
