"""The guides' examples run as the guides show them: `docs/examples/scale_recipe.py`
(Write a job kind, Add a route) registered on a real app, enqueued through its
route and run by the real pool, on both databases."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from flask import Flask

from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.service import get_jobs
from mealquest.model.recipes import ParsedRecipe
from mealquest.openapi import build_document
from tests.conftest import wait_for

pytestmark = pytest.mark.both_databases

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scale_recipe = _example("scale_recipe")


# --8<-- [start:fixture]
@pytest.fixture
def app(make_app) -> Flask:
    app = with_the_guides_kind(make_app())
    get_jobs(app).start_pool()
    return app


def with_the_guides_kind(app: Flask) -> Flask:
    """As the guides say: the kind with the app's other kinds, the route on
    the authenticated /api/v1 (here beside it, as a test cannot add to a
    blueprint the app already holds; the prefix is what authenticates). A
    reader who followed the guide has both in the app already: then the
    suite tests theirs (registering a kind twice is an error)."""
    if get_jobs(app).registry.get(scale_recipe.KIND) is None:
        scale_recipe.register(app)
    if not any(rule.rule == "/api/v1/recipe-scalings" for rule in app.url_map.iter_rules()):
        app.register_blueprint(scale_recipe.bp, url_prefix="/api/v1/recipe-scalings")
    return app


# --8<-- [end:fixture]


def test_a_kind_the_reader_added_as_the_guide_says_is_the_one_tested(make_app):
    # Following the guide to the letter once broke the suite: the reader's
    # `scale_recipe` and the suite's example were both registered.
    app = with_the_guides_kind(make_app())  # as the reader's create_app would have it
    assert with_the_guides_kind(app) is app  # and the suite's fixture again: no error


def _recipe(app: Flask, household_id: int, yields: str | None) -> str:
    store = get_store(app)
    job_id = get_jobs(app).enqueue(
        "recipe_import", {"url": "https://example.com/soup"}, household_id=household_id
    )
    parsed = ParsedRecipe(
        "Tomato soup",
        ["1 kg tomatoes", "1 1/2 onions", "0.5 tsp salt", "a pinch of pepper"],
        ["Cook."],
        yields,
        None,
        None,
        None,
    )
    recipe = store.write(
        store.recipes.upsert_for_job,
        household_id=household_id,
        job_id=job_id,
        source_url="https://example.com/soup",
        parsed=parsed,
    )
    return recipe.id


def _finished(client, auth, location: str) -> dict:
    def final():
        job = client.get(location, headers=auth).get_json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(final)


# --8<-- [start:test]
def test_the_guides_kind_scales_a_recipe_enqueued_through_its_route(app, household, auth):
    recipe_id = _recipe(app, household.household_id, "4 servings")
    client = app.test_client()
    answer = client.post(
        "/api/v1/recipe-scalings", json={"recipe_id": recipe_id, "servings": 6}, headers=auth
    )
    assert answer.status_code == 202, answer.get_json()
    job = _finished(client, auth, answer.headers["Location"])
    assert job["status"] == "succeeded", job
    assert job["result"] == {
        "recipe_id": recipe_id,
        "servings": 6,
        "ingredients": ["1.5 kg tomatoes", "2.25 onions", "0.75 tsp salt", "a pinch of pepper"],
    }


# --8<-- [end:test]


def test_another_households_recipe_fails_the_job_with_the_guides_message(
    app, household, auth, store
):
    other = create_household(store, "The Joneses")
    recipe_id = _recipe(app, other.household_id, "4")
    client = app.test_client()
    answer = client.post(
        "/api/v1/recipe-scalings", json={"recipe_id": recipe_id, "servings": 2}, headers=auth
    )
    job = _finished(client, auth, answer.headers["Location"])
    assert (job["status"], job["error"]) == ("failed", "recipe not found")


def test_the_guides_route_checks_its_body_and_is_in_the_openapi_document(app, auth):
    client = app.test_client()
    answer = client.post(
        "/api/v1/recipe-scalings", json={"recipe_id": "nope", "servings": 0}, headers=auth
    )
    assert answer.status_code == 400
    assert set(answer.get_json()["error"]["fields"]) == {"recipe_id", "servings"}
    assert client.post("/api/v1/recipe-scalings", json={}).status_code == 401
    with app.app_context():
        document = build_document(app)
    operation = document["paths"]["/api/v1/recipe-scalings"]["post"]
    assert operation["summary"] == "Scale one of the household's recipes to a number of servings."
    assert {"202", "200", "400", "422", "429"} <= set(operation["responses"])


def test_the_getting_started_page_imports_as_the_guide_shows(make_app):
    # Getting started imports docs/examples/tomato-soup.html, served from the
    # docs folder as it says: the recipe its answer shows. An app of its
    # own (this module's runs a pool that may not read private addresses).
    from tests.support.pages import PageServer

    pages = PageServer().start()
    try:
        pages.page("/tomato-soup.html", (EXAMPLES / "tomato-soup.html").read_bytes())
        app = make_app(ALLOW_PRIVATE_URLS=True)
        get_jobs(app).start_pool()
        token = create_household(get_store(app), "Home").token
        auth = {"Authorization": f"Bearer {token}"}
        client = app.test_client()
        posted = client.post(
            "/api/v1/recipe-imports", json={"url": pages.url("/tomato-soup.html")}, headers=auth
        )
        assert posted.status_code == 202, posted.get_json()
        job_id = posted.get_json()["id"]
        job = wait_for(
            lambda: (
                (found := client.get(f"/api/v1/jobs/{job_id}", headers=auth).get_json())["status"]
                in ("succeeded", "failed")
                and found
            )
        )
    finally:
        pages.stop()
    assert job["status"] == "succeeded", job
    recipe = job["result"]["recipe"]
    assert (recipe["title"], recipe["yields"], recipe["total_time_minutes"]) == (
        "Tomato soup",
        "4 servings",
        30,
    )
    assert recipe["ingredients"] == [
        "1 kg tomatoes",
        "1 onion",
        "2 tbsp olive oil",
        "500 ml vegetable stock",
    ]
    assert recipe["instructions"] == [
        "Soften the onion in the oil.",
        "Add the tomatoes and stock; simmer 20 minutes, then blend.",
    ]


# The fields of a 202's sample whose values any new import answers alike.
_STABLE = ("kind", "status", "attempt", "max_attempts", "result", "error", "finished_at")


def _samples(path: Path) -> list[str]:
    """The JSON of each `202` answer a page shows (after its headers)."""
    found = re.findall(
        r"HTTP/1\.1 202 ACCEPTED\n(?:[^\n]+\n)*\n(\{.*?\})\n```", path.read_text(), re.S
    )
    assert found, f"no 202 sample in {path}"
    return found


def test_the_202_samples_of_the_readme_and_getting_started_are_the_services(make_app):
    # They showed `running` and attempt 1 where the service answers `queued`,
    # attempt 0 and a `queue` object.
    app = make_app(ALLOW_PRIVATE_URLS=True)  # no pool: the answer as made at the enqueue
    token = create_household(get_store(app), "Home").token
    real = (
        app.test_client()
        .post(
            "/api/v1/recipe-imports",
            json={"url": "http://127.0.0.1:8765/tomato-soup.html"},
            headers={"Authorization": f"Bearer {token}"},
        )
        .get_json()
    )
    root = EXAMPLES.parents[1]
    for page in (root / "README.md", root / "docs" / "getting-started.md"):
        for sample in _samples(page):
            if "…" in sample:  # abbreviated: the pairs it shows
                shown = json.loads(sample.replace(", …}", "}"))
            else:
                shown = json.loads(sample)
                assert set(shown) == set(real), page
                assert set(shown["queue"]) == set(real["queue"]), page
            for key in _STABLE:
                if key in shown:
                    assert shown[key] == real[key], (page, key)
