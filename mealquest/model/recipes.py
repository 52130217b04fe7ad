"""Recipes: as a page's parse gives them, and as stored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedRecipe:
    title: str
    ingredients: list[str]
    instructions: list[str]
    yields: str | None
    total_time_minutes: int | None
    image_url: str | None
    author: str | None


@dataclass(frozen=True)
class Recipe:
    id: str
    seq: int
    household_id: int
    job_id: str | None
    title: str
    ingredients: list[str]
    instructions: list[str]
    yields: str | None
    total_time_minutes: int | None
    image_url: str | None
    source_url: str
    author: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Recipe:
        values = dict(row)
        values["ingredients"] = json.loads(values["ingredients"])
        values["instructions"] = json.loads(values["instructions"])
        return cls(**values)
