"""Bearer tokens: every /api/v1 route needs a live one; the database keeps only digests."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mealquest.households import (
    TOKEN_PREFIX,
    TOKEN_USE_SECONDS,
    create_token,
    household_for_token,
    list_tokens,
    note_token_use,
    revoke_token,
    token_digest,
)
from tests.support.processes import REPO
from tests.support.servers import serving_env

pytestmark = pytest.mark.both_databases


def assert_unauthorized(response):
    assert response.status_code == 401
    assert response.is_json
    assert response.get_json() == {
        "error": {"code": "unauthorized", "message": "a valid bearer token is required"}
    }
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


BASIC = "Basic " + base64.b64encode(b"smith:password").decode()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer  ",
        BASIC,
        "garbage",
        "Token mq_something",
        "Bearer mq_unknown-token-that-was-never-issued",
        "Bearer not-even-our-prefix",
        "Bearer " + TOKEN_PREFIX + "x" * 5000,
        "Bearer a=b",
    ],
    ids=[
        "missing",
        "empty",
        "scheme-alone",
        "scheme-and-space",
        "scheme-and-spaces",
        "basic",
        "garbage",
        "other-scheme",
        "unknown-token",
        "foreign-token",
        "huge-token",
        "parameters",
    ],
)
def test_a_request_without_a_live_token_is_401(client, household, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    assert_unauthorized(client.get("/api/v1/jobs", headers=headers))
    assert_unauthorized(client.get("/api/v1/jobs/" + "0" * 32, headers=headers))


@pytest.mark.parametrize(
    "path",
    ["/api/v1/jobs", "/api/v1/jobs/" + "0" * 32, "/api/v1/recipe-imports", "/api/v1/nothing"],
)
def test_options_needs_a_token_like_every_other_method(client, household, path):
    assert_unauthorized(client.options(path))
    assert_unauthorized(client.options(path, headers={"Authorization": "Bearer mq_unknown"}))

    answer = client.options(path, headers={"Authorization": f"Bearer {household.token}"})
    if path.endswith("/nothing"):
        assert answer.status_code == 404
    else:
        assert answer.status_code == 200
        assert "OPTIONS" in answer.headers["Allow"]


def test_a_token_of_another_scheme_carrying_a_good_token_is_refused(client, household):
    assert_unauthorized(client.get("/api/v1/jobs", headers={"Authorization": household.token}))
    assert_unauthorized(
        client.get("/api/v1/jobs", headers={"Authorization": f"Basic {household.token}"})
    )
    assert_unauthorized(
        client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {household.token}x"})
    )


def test_a_good_token_reaches_the_route_with_its_household(
    client, jobs, household, other_household
):
    mine = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    theirs = jobs.enqueue("succeed", {"value": 2}, household_id=other_household.household_id)

    response = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {household.token}"})
    assert response.status_code == 200
    assert [job["id"] for job in response.get_json()["jobs"]] == [mine]

    response = client.get(
        "/api/v1/jobs", headers={"Authorization": f"Bearer {other_household.token}"}
    )
    assert [job["id"] for job in response.get_json()["jobs"]] == [theirs]
    # The scheme is case-insensitive (RFC 7235).
    response = client.get("/api/v1/jobs", headers={"Authorization": f"bearer {household.token}"})
    assert response.status_code == 200


def test_a_revoked_token_is_401_at_once_and_other_tokens_still_work(client, store, household):
    second = create_token(store, household.household_id)
    headers = {"Authorization": f"Bearer {household.token}"}
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200

    revoke_token(store, household.token_id)

    assert_unauthorized(client.get("/api/v1/jobs", headers=headers))
    response = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {second.token}"})
    assert response.status_code == 200


def test_a_job_read_with_a_token_revoked_by_another_process_is_401_on_the_next_request(
    client, jobs, database, household, other_household
):
    """The job route checks its token in the statement that reads the job (no
    hook; its answer is kept only while nothing commits): `flask tokens revoke`
    in another process shows at once."""
    second = create_token(jobs.store, household.household_id)
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    path = f"/api/v1/jobs/{job_id}"
    headers = {"Authorization": f"Bearer {household.token}"}
    assert client.get(path, headers=headers).get_json()["id"] == job_id
    # Another household's token is live but the job is not its own: 404, not 401.
    theirs = client.get(path, headers={"Authorization": f"Bearer {other_household.token}"})
    assert theirs.status_code == 404
    assert client.get("/api/v1/jobs/" + "0" * 32, headers=headers).status_code == 404
    assert client.get("/api/v1/jobs/not-an-id", headers=headers).status_code == 404

    revoked = subprocess.run(
        [sys.executable, "-m", "flask", "tokens", "revoke", str(household.token_id)],
        cwd=REPO,
        env=serving_env(database),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert revoked.returncode == 0, revoked.stderr

    assert_unauthorized(client.get(path, headers=headers))
    assert client.head(path, headers=headers).status_code == 401
    assert_unauthorized(client.get("/api/v1/jobs/" + "0" * 32, headers=headers))
    assert_unauthorized(client.get("/api/v1/jobs/not-an-id", headers=headers))
    assert_unauthorized(client.get("/api/v1/jobs", headers=headers))
    kept = client.get(path, headers={"Authorization": f"Bearer {second.token}"})
    assert kept.get_json()["id"] == job_id


def test_the_job_route_refuses_what_the_hook_refuses(client, jobs, household):
    """The route that authenticates itself gives the hook's 401 for every bad
    header, and OPTIONS on it still goes through the hook."""
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    path = f"/api/v1/jobs/{job_id}"
    for authorization in (
        household.token,
        f"Basic {household.token}",
        f"Bearer {household.token}x",
        f"Bearer {household.token[len(TOKEN_PREFIX) :]}",
        "Bearer ",
    ):
        assert_unauthorized(client.get(path, headers={"Authorization": authorization}))
    assert_unauthorized(client.get(path))
    assert_unauthorized(client.options(path))
    answer = client.head(path, headers={"Authorization": f"bearer {household.token}"})
    assert answer.status_code == 200


def test_healthz_needs_no_token(client):
    assert client.get("/healthz").status_code == 200


def test_tokens_are_stored_only_as_sha256_digests(store, db_path, household, other_household):
    extra = create_token(store, household.household_id)
    issued = [household, other_household, extra]
    store.close()  # checkpoint nothing by hand: the WAL is read below as well

    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT id, household_id, token_sha256 FROM api_tokens ORDER BY id")
        stored = {row[0]: (row[1], row[2]) for row in rows}
        columns = [row[1] for row in conn.execute("PRAGMA table_info(api_tokens)")]
    finally:
        conn.close()

    assert columns == [
        "id",
        "household_id",
        "token_sha256",
        "created_at",
        "revoked_at",
        "name",
        "last_used_at",
    ]
    assert set(stored) == {token.token_id for token in issued}
    for token in issued:
        household_id, digest = stored[token.token_id]
        assert household_id == token.household_id
        assert digest == hashlib.sha256(token.token.encode()).hexdigest()
        assert digest == token_digest(token.token)
        assert token.token.startswith(TOKEN_PREFIX)
    # The clear token appears nowhere on disk, in the database or its WAL.
    for path in Path(db_path).parent.glob(Path(db_path).name + "*"):
        data = path.read_bytes()
        for token in issued:
            assert token.token.encode() not in data, path.name


def test_tokens_are_unique_and_unguessable(store, household):
    tokens = {create_token(store, household.household_id).token for _ in range(20)}
    assert len(tokens) == 20
    assert all(len(token) >= len(TOKEN_PREFIX) + 40 for token in tokens)


def test_household_for_token_reads_only_live_tokens(store, household):
    found = household_for_token(store, household.token)
    assert found is not None
    assert (found.id, found.name) == (household.household_id, "The Smiths")
    assert household_for_token(store, "") is None
    assert household_for_token(store, household.token[:-1]) is None
    revoke_token(store, household.token_id)
    assert household_for_token(store, household.token) is None


def test_a_tokens_use_is_written_at_most_once_a_minute_a_process(client, store, household):
    digest = token_digest(household.token)

    def last_used():
        return list_tokens(store, household.household_id)[0].last_used_at

    def forget():
        store.write(lambda tx: tx.execute("UPDATE api_tokens SET last_used_at = NULL"))

    assert last_used() is None
    note_token_use(store, digest, now=1_000_000.0)
    assert last_used() is not None
    forget()
    note_token_use(store, digest, now=1_000_000.0 + TOKEN_USE_SECONDS - 1)
    assert last_used() is None  # within the minute: no write
    note_token_use(store, digest, now=1_000_000.0 + TOKEN_USE_SECONDS)
    assert last_used() is not None


def test_a_request_records_its_tokens_use(client, store, household):
    assert list_tokens(store, household.household_id)[0].last_used_at is None
    assert (
        client.get(
            "/api/v1/jobs", headers={"Authorization": f"Bearer {household.token}"}
        ).status_code
        == 200
    )
    assert list_tokens(store, household.household_id)[0].last_used_at is not None
