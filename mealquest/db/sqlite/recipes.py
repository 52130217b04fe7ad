"""Every SQL statement about recipes: writes take a `Transaction`, reads a connection."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.recipes import ParsedRecipe, Recipe

_COLUMNS = (
    "id, seq, household_id, job_id, title, ingredients, instructions, yields, "
    "total_time_minutes, image_url, source_url, author, created_at, updated_at"
)


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
    now = to_text(utc_now())
    row = tx.execute(
        "INSERT INTO recipes (id, household_id, job_id, title, ingredients, instructions, "
        "yields, total_time_minutes, image_url, source_url, author, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
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
            now,
            now,
        ),
    ).fetchone()
    return Recipe.from_row(row)


def get_recipe(conn: Reads, recipe_id: str, household_id: int) -> Recipe | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE id = ? AND household_id = ?",
        (recipe_id, household_id),
    ).fetchone()
    return Recipe.from_row(row) if row else None


def recipes_of_jobs(conn: Reads, household_id: int, job_ids: Sequence[str]) -> list[Recipe]:
    """The recipes the household's jobs `job_ids` imported, in the jobs' order."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE household_id = ? "
        "AND job_id IN (SELECT value FROM json_each(?))",
        (household_id, json.dumps(list(job_ids))),
    ).fetchall()
    order = {job_id: index for index, job_id in enumerate(job_ids)}
    recipes = [Recipe.from_row(row) for row in rows]
    return sorted(recipes, key=lambda recipe: order[recipe.job_id or ""])


def list_recipes(
    conn: Reads, *, household_id: int, before_seq: int | None, limit: int
) -> list[Recipe]:
    """A household's recipes, newest first (index `recipes_household`)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM recipes WHERE household_id = ? AND seq < ? "
        "ORDER BY seq DESC LIMIT ?",
        (household_id, before_seq if before_seq is not None else 2**63 - 1, limit),
    ).fetchall()
    return [Recipe.from_row(row) for row in rows]


def delete_household_recipes(tx: Transaction, household_id: int, *, limit: int) -> int:
    """Delete up to `limit` of the household's recipes (through its index); how many were."""
    cursor = tx.execute(
        "DELETE FROM recipes WHERE seq IN (SELECT seq FROM recipes INDEXED BY recipes_household "
        "WHERE household_id = ? LIMIT ?)",
        (household_id, limit),
    )
    return cursor.rowcount
