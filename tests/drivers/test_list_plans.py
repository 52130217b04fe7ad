"""Every list of a household's jobs, whatever its filters, is served by an
index of that household's rows: its cost does not grow with the jobs of
other households. Each filter combination's statement, as the driver runs
it, is explained on a table holding many other households' jobs (and its
statistics), on both databases; a scan, or an index that does not start
with the household and serve the filter, fails the test."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mealquest.db import listing
from mealquest.model.jobs import Status
from tests.drivers.conftest import other_household

OTHER_ROWS = 3_000
STATUSES = [None, *Status]
KINDS = [None, "recipe_import"]


class Recording:
    """A connection that notes the statements run on it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = (), /) -> Any:
        self.statements.append((sql, params))
        return self.conn.execute(sql, params)


def fill_with_other_households(store) -> None:
    """Many households' jobs of every status and of the filtered kind, then the
    table's statistics, as a long-lived deployment has them."""
    others = [other_household(store, f"other {n}", f"{n:x}"[-1]) for n in range(3)]
    statuses = ", ".join(f"'{status}'" for status in Status)
    if store.name == "postgresql":
        store.write(
            lambda tx: tx.execute(
                "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, "
                "on_interrupt, run_at, created_at, updated_at, finished_at, attempt, "
                "lease_owner, lease_expires_at, started_at, error) "
                "SELECT md5(n::text), (%(others)s::bigint[])[1 + n %% 3], "
                "CASE WHEN n %% 2 = 0 THEN 'recipe_import' ELSE 'other' END, '{}', "
                f"s.status, 1, 'fail', now(), now(), now(), "
                "CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled') THEN now() END, "
                "CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END, "
                "CASE WHEN s.status = 'running' THEN 'w' END, "
                "CASE WHEN s.status = 'running' THEN now() END, "
                "CASE WHEN s.status <> 'queued' THEN now() END, "
                "CASE WHEN s.status = 'failed' THEN 'boom' END "
                "FROM generate_series(1, %(rows)s) AS n, "
                f"LATERAL (SELECT (ARRAY[{statuses}])[1 + n %% 5] AS status) AS s",
                {"others": others, "rows": OTHER_ROWS},
            )
        )
        store.write(lambda tx: tx.execute("ANALYZE jobs"))
        return
    store.write(
        lambda tx: tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, "
            "on_interrupt, run_at, created_at, updated_at, finished_at, attempt, "
            "lease_owner, lease_expires_at, started_at, error) "
            "SELECT printf('%032x', i), json_extract(?, '$[' || (i % 3) || ']'), "
            "CASE WHEN i % 2 = 0 THEN 'recipe_import' ELSE 'other' END, '{}', status, 1, "
            "'fail', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z', "
            "'2026-01-01T00:00:00.000000Z', "
            "CASE WHEN status IN ('succeeded', 'failed', 'cancelled') "
            "THEN '2026-01-01T00:00:01.000000Z' END, "
            "CASE WHEN status = 'queued' THEN 0 ELSE 1 END, "
            "CASE WHEN status = 'running' THEN 'w' END, "
            "CASE WHEN status = 'running' THEN '2026-01-01T00:01:00.000000Z' END, "
            "CASE WHEN status <> 'queued' THEN '2026-01-01T00:00:00.500000Z' END, "
            "CASE WHEN status = 'failed' THEN 'boom' END "
            f"FROM (SELECT i, json_extract('[{statuses.replace(chr(39), chr(34))}]', "
            "'$[' || (i % 5) || ']') AS status FROM n)",
            (OTHER_ROWS, json.dumps(others)),
        )
    )
    store.write(lambda tx: tx.execute("ANALYZE"))


def statement_of(store, household: int, status, kind) -> tuple[str, Any]:
    def run(conn):
        recording = Recording(conn)
        store.jobs.list_jobs(recording, household_id=household, status=status, kind=kind, limit=51)
        return recording.statements

    [statement] = store.read(run)
    return statement


def sqlite_plan(store, sql: str, params: Any) -> list[str]:
    rows = store.read(lambda conn: conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall())
    return [row["detail"] for row in rows]


def postgresql_scans(store, sql: str, params: Any) -> list[dict[str, Any]]:
    """Every node of the plan that reads a table or an index."""
    [[plan]] = store.read(
        lambda conn: list(conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone().values())
    )
    scans = []
    pending = [plan["Plan"]]
    while pending:
        node = pending.pop()
        if "Scan" in node["Node Type"]:
            scans.append(node)
        pending.extend(node.get("Plans", []))
    return scans


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: f"kind={kind}")
@pytest.mark.parametrize("status", STATUSES, ids=lambda status: f"status={status}")
def test_every_filter_of_a_households_list_reads_only_its_own_rows(store, status, kind):
    fill_with_other_households(store)
    household = other_household(store, "The Smiths", "f")
    sql, params = statement_of(store, household, status, kind)
    index, _implied = listing.household_index(status, kind)

    if store.name == "sqlite":
        plan = sqlite_plan(store, sql, params)
        searches = [step for step in plan if step.startswith(("SEARCH", "SCAN"))]
        assert searches == [step for step in searches if step.startswith("SEARCH")], plan
        [search] = searches
        assert f"USING INDEX {index} (household_id=?" in search, plan
        if kind is not None:
            assert "kind=?" in search, plan
        if index == "jobs_household_finished":
            assert "status=?" in search, plan
        return
    scans = postgresql_scans(store, sql, params)
    assert all(scan["Node Type"] != "Seq Scan" for scan in scans), scans
    for scan in scans:
        assert scan.get("Index Name", "").startswith(("jobs_household", "jobs_running")), scans
        assert "household_id" in scan.get("Index Cond", ""), scans
