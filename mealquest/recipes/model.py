"""A stored recipe as the service reads it."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass


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
    def from_row(cls, row: sqlite3.Row) -> Recipe:
        values = dict(row)
        values["ingredients"] = json.loads(values["ingredients"])
        values["instructions"] = json.loads(values["instructions"])
        return cls(**values)
