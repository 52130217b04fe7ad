"""Raw SQL in tests, on either database: `?` placeholders, rows by column name."""

from __future__ import annotations

from typing import Any

from mealquest.db.driver import Store


def dialect(store: Store, sql: str) -> str:
    """`sql` with `?` placeholders as the store's driver takes them."""
    return sql.replace("?", "%s") if store.name == "postgresql" else sql


def execute(store: Store, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Run one write statement in its own transaction; the rows it changed."""
    return store.write(lambda tx: tx.execute(dialect(store, sql), params).rowcount)


def rows(store: Store, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    return store.read(
        lambda conn: [dict(row) for row in conn.execute(dialect(store, sql), params).fetchall()]
    )


def scalar(store: Store, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row."""
    [row] = rows(store, sql, params)[:1]
    return next(iter(row.values()))
