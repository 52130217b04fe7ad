"""The SQL of recipes on PostgreSQL: writes take a transaction, reads a connection."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
from mealquest.model.recipes import ParsedRecipe, Recipe

_COLUMNS = (
    "id, seq, household_id, job_id, title, ingredients, instructions, yields, "
    "total_time_minutes, image_url, source_url, author, created_at, updated_at"
)


def _recipe(row: dict[str, Any]) -> Recipe:
    """A row as `Recipe` has it on every driver: times as fixed-width UTC text."""
    values = dict(row)
    values["created_at"] = to_text(values["created_at"])
    values["updated_at"] = to_text(values["updated_at"])
    return Recipe.from_row(values)


def upsert_for_job(
    tx: Transaction,
    *,
    household_id: int,
    job_id: str,
    source_url: str,
    parsed: ParsedRecipe,
) -> Recipe:
    """Store the recipe a job imported. Keyed on the job: a retried or rescued
    job updates the recipe it stored before (same id) instead of adding one."""
    row = tx.execute(
        "INSERT INTO recipes (id, household_id, job_id, title, ingredients, instructions, "
        "yields, total_time_minutes, image_url, source_url, author, created_at, updated_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now(), now()) "
        "ON CONFLICT (job_id) DO UPDATE SET title = excluded.title, "
        "ingredients = excluded.ingredients, instructions = excluded.instructions, "
        "yields = excluded.yields, total_time_minutes = excluded.total_time_minutes, "
        "image_url = excluded.image_url, source_url = excluded.source_url, "
        "author = excluded.author, updated_at = excluded.updated_at "
        f"RETURNING {_COLUMNS}",
        (
            uuid.uuid4().hex,
            household_id,
            job_id,
            parsed.title,
            json.dumps(parsed.ingredients),
            json.dumps(parsed.instructions),
            parsed.yields,
            parsed.total_time_minutes,
            parsed.image_url,
            source_url,
            parsed.author,
        ),
    ).fetchone()
    return _recipe(row)


def get_recipe(conn: Reads, recipe_id: str, household_id: int) -> Recipe | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE id = %s AND household_id = %s",
        (recipe_id, household_id),
    ).fetchone()
    return _recipe(row) if row else None


def recipes_of_jobs(conn: Reads, household_id: int, job_ids: Sequence[str]) -> list[Recipe]:
    """The recipes the household's jobs `job_ids` imported, in the jobs' order."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE household_id = %s AND job_id = ANY(%s::text[])",
        (household_id, list(job_ids)),
    ).fetchall()
    order = {job_id: index for index, job_id in enumerate(job_ids)}
    return sorted((_recipe(row) for row in rows), key=lambda recipe: order[recipe.job_id or ""])


def list_recipes(
    conn: Reads, *, household_id: int, before_seq: int | None, limit: int
) -> list[Recipe]:
    """A household's recipes, newest first (index `recipes_household`)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE household_id = %s AND seq < %s "
        "ORDER BY seq DESC LIMIT %s",
        (household_id, before_seq if before_seq is not None else 2**63 - 1, limit),
    ).fetchall()
    return [_recipe(row) for row in rows]


def delete_household_recipes(tx: Transaction, household_id: int, *, limit: int) -> int:
    """Delete up to `limit` of the household's recipes; how many were (the
    batch chosen once: see `retention.delete_finished`)."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT seq FROM recipes WHERE household_id = %s "
        "LIMIT %s FOR UPDATE SKIP LOCKED) DELETE FROM recipes WHERE seq IN (SELECT seq FROM batch)",
        (household_id, limit),
    )
    return cursor.rowcount
