"""Storage faults: a full disk or a file that cannot be opened is `503 unavailable`, told once,
and the service heals by itself when the storage does, with nothing committed lost.

The full disk is real: a small tmpfs this module mounts (as root), filled to the last byte.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mealquest.db.errors import StorageFault, StoreUnavailable
from mealquest.db.sqlite import migrate
from mealquest.db.sqlite.store import SqliteStore
from mealquest.health import MAX_AGE_SECONDS, health_check
from tests.support.small_disk import SmallDisk
from tests.support.ticks import Ticks
from tests.test_store import household_names, insert_household

pytestmark = pytest.mark.sqlite_only("a full disk and an unreadable file under SQLite's own file")

URL = "https://recipes.example/soup"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    try:
        disk = SmallDisk(tmp_path / "disk", 4 * 1024 * 1024)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield disk
    finally:
        disk.free()
        disk.unmount()


@pytest.fixture
def database(small_disk: SmallDisk) -> dict[str, str]:
    """Overrides conftest's: the app, its store and the household live on the small disk."""
    path = str(small_disk.path / "mealquest.sqlite3")
    migrate.upgrade(path)
    return {"DATABASE": path}


def assert_unavailable(response):
    assert response.status_code == 503
    assert response.get_json() == {
        "error": {
            "code": "unavailable",
            "message": "the service cannot use its storage now; try again shortly",
        }
    }
    assert 1 <= int(response.headers["Retry-After"]) <= 60


def test_a_full_disk_is_503_told_once_and_heals_by_itself_with_nothing_lost(
    client, auth, small_disk, logs
):
    def enqueue():
        return client.post("/api/v1/recipe-imports", json={"url": URL}, headers=auth)

    health_check(client.application).clock = ticks = Ticks()
    before = [enqueue() for _ in range(3)]
    assert [answer.status_code for answer in before] == [202, 202, 202]
    assert client.get("/healthz").status_code == 200
    logs.clear()

    small_disk.fill()
    for _ in range(20):
        assert_unavailable(enqueue())
    ticks.advance(MAX_AGE_SECONDS)  # /healthz answers from a check made now
    for _ in range(3):
        assert_unavailable(client.get("/healthz"))
    # Reads need no room: the jobs committed before are all there.
    listed = client.get("/api/v1/jobs", headers=auth)
    assert listed.status_code == 200
    assert len(listed.get_json()["jobs"]) == 3

    # One line for the whole fault, at ERROR, naming it; no traceback, nothing per request.
    assert [(r.levelno, r.name) for r in logs.records] == [
        (logging.ERROR, "mealquest.db.sqlite.faults")
    ]
    assert "disk full (SQLITE_FULL)" in logs.records[0].getMessage()
    assert logs.records[0].exc_info is None
    assert str(small_disk.path) not in logs.text
    logs.clear()

    small_disk.free()
    ticks.advance(MAX_AGE_SECONDS)
    assert client.get("/healthz").status_code == 200
    after = enqueue()
    assert after.status_code == 202
    # The end of the fault is told once too, with how many writes it refused.
    assert [(r.levelno, r.name) for r in logs.records] == [
        (logging.WARNING, "mealquest.db.sqlite.faults")
    ]
    assert "20 refused" in logs.records[0].getMessage()

    listed = client.get("/api/v1/jobs", headers=auth).get_json()["jobs"]
    expected = {answer.get_json()["id"] for answer in [*before, after]}
    assert {job["id"] for job in listed} == expected


def test_a_write_on_a_full_disk_is_a_storage_fault_until_there_is_room(store, small_disk):
    store.write(insert_household, "before")
    small_disk.fill()

    with pytest.raises(StorageFault) as raised:
        store.write(insert_household, "refused")
    fault = raised.value
    assert isinstance(fault, StoreUnavailable)  # what the runner and the API catch
    assert (fault.name, fault.reason, fault.disk_full) == ("SQLITE_FULL", "disk full", True)
    assert str(small_disk.path) not in str(fault)
    assert fault.__cause__ is None
    assert fault.__suppress_context__  # SQLite's text is not carried
    assert store.write_fault is not None

    # A write that changes nothing still commits on a full disk (the lock is
    # all it takes): it proves nothing, so the fault stays, and so does the 503.
    assert (
        store.write(
            lambda tx: tx.execute("SELECT count(*) FROM households WHERE id <> 0").fetchone()[0]
        )
        == 1
    )
    assert store.write_fault is not None
    with pytest.raises(StorageFault):
        store.check_writable()
    assert household_names(store) == ["before"]

    small_disk.free()
    store.check_writable()
    assert store.write_fault is None
    store.write(insert_household, "after")
    assert household_names(store) == ["before", "after"]


def test_a_database_that_cannot_be_opened_is_a_storage_fault_until_it_can(tmp_path, logs):
    path = tmp_path / "not-yet" / "mealquest.sqlite3"
    store = SqliteStore(str(path), busy_timeout_seconds=0.5)
    try:
        for _ in range(3):
            with pytest.raises(StorageFault) as raised:
                store.write(insert_household, "refused")
            assert raised.value.name == "SQLITE_CANTOPEN"
            with pytest.raises(StorageFault) as raised:
                household_names(store)
            assert raised.value.name == "SQLITE_CANTOPEN"
        with pytest.raises(StorageFault):
            store.check_writable()
        # Once for writes and once for reads, not once per call.
        errors = [r for r in logs.records if r.levelno >= logging.ERROR]
        assert [r.getMessage().split(":")[1].strip() for r in errors] == [
            "writes fail",
            "reads fail",
        ]
        assert all(r.exc_info is None for r in logs.records)

        migrate.upgrade(str(path))
        store.check_writable()
        store.write(insert_household, "opened")
        assert household_names(store) == ["opened"]
        ended = [r.getMessage() for r in logs.records if r.levelno == logging.WARNING]
        assert len(ended) == 2
        assert "writes work again" in ended[0]
        assert "4 refused" in ended[0]
        assert "reads work again" in ended[1]
        assert "3 refused" in ended[1]
    finally:
        store.close()
