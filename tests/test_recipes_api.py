"""`POST /api/v1/recipe-imports` and `GET /api/v1/recipes[/{id}]`: validation, scoping, pages."""

from __future__ import annotations

import logging

import pytest

from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.model.recipes import ParsedRecipe
from tests.support import sql

pytestmark = pytest.mark.both_databases

URL = "https://recipes.example/soup"


def store_recipe(app, household_id: int, title: str) -> str:
    """A recipe as the kind stores it, for its own import job."""
    job_id = get_jobs(app).enqueue("recipe_import", {"url": URL}, household_id=household_id)
    parsed = ParsedRecipe(title, ["salt"], ["Cook."], None, None, None, None)
    store = get_store(app)
    recipe = store.write(
        store.recipes.upsert_for_job,
        household_id=household_id,
        job_id=job_id,
        source_url=URL,
        parsed=parsed,
    )
    return recipe.id


def job_count(app) -> int:
    return len(get_jobs(app).list_jobs(limit=100))


# -- starting an import -------------------------------------------------------------------


def test_an_import_answers_202_with_the_job_and_its_location(app, client, auth):
    response = client.post("/api/v1/recipe-imports", json={"url": URL}, headers=auth)

    assert response.status_code == 202
    job = response.get_json()
    assert response.headers["Location"] == f"/api/v1/jobs/{job['id']}"
    assert job == {
        "id": job["id"],
        "kind": "recipe_import",
        "status": "queued",
        "result": None,
        "error": None,
        "attempt": 0,
        "max_attempts": 3,
        "created_at": job["created_at"],
        "run_at": job["created_at"],
        "started_at": None,
        "finished_at": None,
        "version": 1,
        # No pool runs in this test: no live process handles the kind.
        "queue": {
            "position": 0,
            "ahead_in_household": 0,
            "estimated_start_at": None,
            "waiting_for": "no_worker",
            "signal": None,
        },
    }
    assert client.get(response.headers["Location"], headers=auth).get_json() == job


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({}, "url", id="missing"),
        pytest.param({"url": None}, "url", id="null"),
        pytest.param({"url": 42}, "url", id="not-a-string"),
        pytest.param({"url": "ftp://recipes.example/soup"}, "url", id="ftp"),
        pytest.param({"url": "file:///etc/passwd"}, "url", id="file"),
        pytest.param({"url": "javascript:alert(1)"}, "url", id="javascript"),
        pytest.param({"url": "recipes.example/soup"}, "url", id="relative"),
        pytest.param({"url": "http://"}, "url", id="no-host"),
        pytest.param({"url": "http://recipes.example:99999/"}, "url", id="bad-port"),
        pytest.param({"url": "http://recipes.example/a b"}, "url", id="space"),
        # A JSON "\\udcff" decodes to a lone surrogate, which no request line can carry.
        pytest.param({"url": "https://recipes.example/\udcff"}, "url", id="lone-surrogate"),
        pytest.param({"url": "https://recipes.example/" + "a" * 2100}, "url", id="over-long"),
        pytest.param({"url": URL, "priority": 1}, "priority", id="unknown-field"),
    ],
)
def test_a_bad_body_is_a_validation_error_naming_the_field(app, client, auth, body, field):
    response = client.post("/api/v1/recipe-imports", json=body, headers=auth)

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "validation_error"
    assert list(error["fields"]) == [field]
    assert job_count(app) == 0


@pytest.mark.parametrize(
    ("data", "content_type", "status"),
    [
        pytest.param(f'{{"url": "{URL}"}}', "text/plain", 415, id="not-json-type"),
        pytest.param('{"url": ', "application/json", 400, id="malformed"),
        pytest.param(f'["{URL}"]', "application/json", 400, id="not-an-object"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(app, client, auth, data, content_type, status):
    response = client.post(
        "/api/v1/recipe-imports", data=data, content_type=content_type, headers=auth
    )

    assert response.status_code == status
    assert response.get_json()["error"]["code"] in ("validation_error", "unsupported_media_type")
    assert job_count(app) == 0


def nested(depth: int, inner: str = "0") -> str:
    """A JSON text of `depth` arrays, one inside the other, around `inner`."""
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    "data",
    [
        # Deep enough for the JSON parser to give up (a RecursionError), well
        # within the body limit.
        pytest.param(nested(30_000), id="past-the-parser"),
        pytest.param("[" * 30_000, id="unclosed"),
        pytest.param('{"url": "' + URL + '", "x": ' + nested(32) + "}", id="33-levels"),
        pytest.param('{"a": ' * 200 + "1" + "}" * 200, id="objects"),
    ],
)
def test_a_body_nested_deeper_than_32_levels_is_a_validation_error(app, client, auth, logs, data):
    response = client.post(
        "/api/v1/recipe-imports", data=data, content_type="application/json", headers=auth
    )

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "validation_error"
    assert list(error["fields"]) == ["_body"]
    assert job_count(app) == 0
    assert not [record for record in logs.records if record.levelno >= logging.ERROR]


def test_a_body_of_32_levels_is_read(app, client, auth):
    # The object is the first level: 31 arrays inside it make 32.
    data = '{"url": "' + URL + '", "x": ' + nested(31) + "}"

    response = client.post(
        "/api/v1/recipe-imports", data=data, content_type="application/json", headers=auth
    )

    # Read, then refused by the schema for its unknown field, not for its depth.
    assert response.status_code == 400
    assert list(response.get_json()["error"]["fields"]) == ["x"]


def test_an_oversized_body_is_413(app, client, auth):
    body = '{"url": "' + URL + '", "pad": "' + "x" * (app.config["MAX_CONTENT_LENGTH"]) + '"}'

    response = client.post(
        "/api/v1/recipe-imports", data=body, content_type="application/json", headers=auth
    )

    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "payload_too_large"
    assert job_count(app) == 0


def test_imports_need_a_token(app, client):
    response = client.post("/api/v1/recipe-imports", json={"url": URL})

    assert response.status_code == 401
    assert job_count(app) == 0


# -- reading recipes ----------------------------------------------------------------------


def test_a_household_reads_its_recipe(app, client, auth, household):
    recipe_id = store_recipe(app, household.household_id, "Soup")

    response = client.get(f"/api/v1/recipes/{recipe_id}", headers=auth)

    assert response.status_code == 200
    recipe = response.get_json()
    assert recipe["id"] == recipe_id
    assert recipe["title"] == "Soup"
    assert recipe["source_url"] == URL


@pytest.mark.parametrize("which", ["other-household", "unknown", "malformed"])
def test_another_households_unknown_or_malformed_recipe_is_the_same_404(
    app, client, auth, other_household, which
):
    recipe_id = {
        "other-household": lambda: store_recipe(app, other_household.household_id, "Theirs"),
        "unknown": lambda: "0" * 32,
        "malformed": lambda: "not-an-id",
    }[which]()

    response = client.get(f"/api/v1/recipes/{recipe_id}", headers=auth)

    assert response.status_code == 404
    assert response.get_json() == {"error": {"code": "not_found", "message": "recipe not found"}}


def test_the_list_is_the_households_newest_first_in_pages(
    app, client, auth, household, other_household
):
    ids = [store_recipe(app, household.household_id, f"Recipe {n}") for n in range(5)]
    store_recipe(app, other_household.household_id, "Theirs")

    first = client.get("/api/v1/recipes?limit=2", headers=auth).get_json()
    second = client.get(
        f"/api/v1/recipes?limit=2&cursor={first['next_cursor']}", headers=auth
    ).get_json()
    third = client.get(
        f"/api/v1/recipes?limit=2&cursor={second['next_cursor']}", headers=auth
    ).get_json()

    pages = [first, second, third]
    assert [[r["id"] for r in page["recipes"]] for page in pages] == [
        ids[4:2:-1],
        ids[2:0:-1],
        ids[0:1],
    ]
    assert third["next_cursor"] is None
    assert client.get("/api/v1/recipes", headers=auth).get_json()["next_cursor"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=x", "cursor=%%%"])
def test_a_bad_list_query_names_the_field(client, auth, query):
    response = client.get(f"/api/v1/recipes?{query}", headers=auth)

    assert response.status_code == 400
    assert list(response.get_json()["error"]["fields"]) == [query.split("=")[0]]


def test_storing_twice_for_one_job_keeps_one_recipe(app, household):
    """A retried or rescued import updates the recipe its job stored, never adds one."""
    job_id = get_jobs(app).enqueue(
        "recipe_import", {"url": URL}, household_id=household.household_id
    )
    store = get_store(app)

    def upsert(title: str):
        parsed = ParsedRecipe(title, ["salt"], ["Cook."], "2", 10, None, "Ann")
        return store.write(
            store.recipes.upsert_for_job,
            household_id=household.household_id,
            job_id=job_id,
            source_url=URL,
            parsed=parsed,
        )

    first = upsert("Soup")
    second = upsert("Better soup")

    assert second.id == first.id
    assert second.title == "Better soup"
    count = sql.scalar(store, "SELECT count(*) FROM recipes")
    assert count == 1


def test_a_page_of_recipes_stops_at_its_byte_bound_and_the_next_continues(
    app, client, auth, household
):
    # A recipe may hold 255 KiB: twenty of them made one answer of megabytes.
    store = get_store(app)
    jobs = get_jobs(app)
    steps = ["y" * 5_000] * 50
    made = []
    for n in range(20):
        job_id = jobs.enqueue("recipe_import", {"url": URL}, household_id=household.household_id)
        parsed = ParsedRecipe(f"Dish {n}", ["salt"], steps, None, None, None, None)
        made.append(
            store.write(
                store.recipes.upsert_for_job,
                household_id=household.household_id,
                job_id=job_id,
                source_url=URL,
                parsed=parsed,
            ).id
        )

    seen, cursor, pages = [], None, 0
    while True:
        query = "/api/v1/recipes?limit=100" + (f"&cursor={cursor}" if cursor else "")
        answer = client.get(query, headers=auth)
        assert answer.status_code == 200
        assert len(answer.get_data()) <= 4 * 1024 * 1024
        body = answer.get_json()
        seen += [recipe["id"] for recipe in body["recipes"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages > 1
    assert seen == list(reversed(made))
