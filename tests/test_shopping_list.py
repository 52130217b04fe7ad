"""A household's week: `POST /api/v1/recipe-imports/batch`, the batch watched
(`GET /api/v1/batches/{id}`, its ETag, long poll and event stream), and the
`shopping_list` kind merging what was imported; on both databases, through
the real pool and a real HTTP server on loopback serving the pages."""

from __future__ import annotations

import json
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import gevent
import pytest
from flask import Flask

from mealquest.db.driver import Store
from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.service import get_jobs
from mealquest.recipes import ingredients, parser_pool
from mealquest.recipes.shopping_list import NOTHING_IMPORTED, TOO_SLOW
from tests.conftest import wait_for
from tests.support import sql
from tests.support.pages import WEEK, PageServer, Reply, recipe_page, week_page
from tests.support.servers import process_state
from tests.test_recipe_import import FETCH_CONFIG

pytestmark = pytest.mark.both_databases

MEATBALLS, BURGERS, PIZZA = WEEK


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    for index, title in enumerate(WEEK):
        server.page(f"/week/{index}", week_page(title))
    yield server
    server.stop()


@pytest.fixture
def app(make_app):
    app = make_app(ALLOW_PRIVATE_URLS=True, **FETCH_CONFIG)
    get_jobs(app).start_pool()
    return app


def post_batch(client, auth, urls, shopping_list=True, **more):
    return client.post(
        "/api/v1/recipe-imports/batch",
        json={"urls": urls, "shopping_list": shopping_list, **more},
        headers=auth,
    )


def job(client, auth, job_id):
    return client.get(f"/api/v1/jobs/{job_id}", headers=auth).get_json()


def final_job(client, auth, job_id):
    return wait_for(
        lambda: (
            (found := job(client, auth, job_id))["status"] in ("succeeded", "failed", "cancelled")
            and found
        ),
        timeout=60,
    )


def count(store, table):
    return sql.scalar(store, f"SELECT count(*) FROM {table}")


def test_a_week_imported_as_a_batch_ends_in_one_shopping_list(app, pages, auth):
    client = app.test_client()
    urls = [pages.url(f"/week/{index}") for index in range(3)] + [pages.url("/gone")]
    answer = post_batch(client, auth, urls)
    assert answer.status_code == 202, answer.get_json()
    body = answer.get_json()
    assert set(body) == {"batch_id", "jobs", "shopping_list_job_id"}
    assert len(body["jobs"]) == 4
    assert answer.headers["Location"] == f"/api/v1/batches/{body['batch_id']}"

    list_job = final_job(client, auth, body["shopping_list_job_id"])
    assert list_job["status"] == "succeeded", list_job
    result = list_job["result"]
    assert result["recipes"] == 3
    # The page that was not there, with the URL it was to import.
    assert result["skipped"] == [{"job_id": body["jobs"][3], "url": urls[3]}]
    items = {(item["food"], item["unit"]): item for item in result["items"]}
    # Olive oil: 2 tbsp and a quarter cup, in the unit the first used, from two recipes.
    oil = items[("olive oil", "tbsp")]
    assert (oil["quantity"], oil["text"]) == (6, "6 tbsp olive oil")
    assert oil["from"] == [MEATBALLS, PIZZA]
    assert items[("pork mince", "g")]["quantity"] == 250
    assert items[("ground beef", "lb")]["quantity"] == 1  # as the site wrote it
    assert items[("mozzarella cheese", "oz")]["text"] == "8 oz mozzarella cheese"
    assert items[("burger buns", None)]["quantity"] == 4
    # What no unit sums is listed as written, with its recipe.
    written = [item for item in result["items"] if item["quantity"] is None]
    assert {"text": "grated parmesan to serve", "from": [MEATBALLS]}.items() <= next(
        item for item in written if item["text"] == "grated parmesan to serve"
    ).items()
    assert sum(len(lines) for lines in WEEK.values()) >= len(result["items"])

    batch = client.get(answer.headers["Location"], headers=auth)
    assert batch.status_code == 200
    shown = batch.get_json()
    assert shown == {
        "id": body["batch_id"],
        "status": "finished",
        "total": 4,
        "queued": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 1,
        "cancelled": 0,
        "jobs": body["jobs"],
        "callback_job_id": body["shopping_list_job_id"],
        "version": shown["version"],
        "created_at": shown["created_at"],
        "finished_at": list_job["finished_at"],
    }
    assert batch.headers["ETag"] == f'"{shown["version"]}"'
    again = client.get(
        answer.headers["Location"], headers={**auth, "If-None-Match": batch.headers["ETag"]}
    )
    assert again.status_code == 304


def test_no_import_succeeded_no_list(app, pages, auth):
    client = app.test_client()
    body = post_batch(client, auth, [pages.url("/nothing"), pages.url("/nothing-else")]).get_json()
    list_job = final_job(client, auth, body["shopping_list_job_id"])
    assert (list_job["status"], list_job["error"]) == ("failed", NOTHING_IMPORTED)


def test_a_long_poll_and_the_stream_follow_the_batch_to_its_end(app, pages, auth):
    client = app.test_client()
    held = threading.Event()
    pages.add("/held", Reply(body=week_page(BURGERS), hold=held))
    body = post_batch(client, auth, [pages.url("/week/0"), pages.url("/held")]).get_json()
    location = f"/api/v1/batches/{body['batch_id']}"
    wait_for(lambda: pages.hits["/held"] == 1)
    first_import = body["jobs"][0]
    wait_for(lambda: job(client, auth, first_import)["status"] == "succeeded")
    now = client.get(location, headers=auth)
    assert now.get_json()["status"] == "running"
    assert now.get_json()["succeeded"] == 1

    # A long poll held until the held import ends.
    answers = []
    poll = gevent.spawn(
        lambda: answers.append(
            client.get(
                f"{location}?wait=30", headers={**auth, "If-None-Match": now.headers["ETag"]}
            )
        )
    )
    gevent.sleep(0.2)
    assert not answers  # still held: nothing changed
    held.set()
    poll.join(timeout=60)
    assert answers[0].status_code == 200
    assert answers[0].get_json()["version"] > now.get_json()["version"]

    # The stream, opened now, runs to the batch's end (the list's job included).
    stream = client.get(f"{location}/events", headers=auth)
    assert stream.status_code == 200
    events = [
        block for block in stream.get_data(as_text=True).split("\n\n") if block.startswith("id:")
    ]
    names = [block.split("\n")[1] for block in events]
    assert names[-1] == "event: end"
    assert set(names[:-1]) == {"event: batch"}
    last = json.loads(events[-2].split("\n")[2].removeprefix("data: "))
    assert last["status"] == "finished"
    assert job(client, auth, body["shopping_list_job_id"])["status"] == "succeeded"


def test_a_batch_is_the_households_own(app, pages, auth, other_household):
    client = app.test_client()
    body = post_batch(client, auth, [pages.url("/week/0")], shopping_list=False).get_json()
    assert body["shopping_list_job_id"] is None
    theirs = {"Authorization": f"Bearer {other_household.token}"}
    for path in ("", "/events"):
        answer = client.get(f"/api/v1/batches/{body['batch_id']}{path}", headers=theirs)
        assert answer.status_code == 404
        assert client.get(f"/api/v1/batches/{body['batch_id']}{path}").status_code == 401
    assert client.get("/api/v1/batches/not-a-batch", headers=auth).status_code == 404


@pytest.mark.parametrize(
    ("urls", "fields"),
    [
        pytest.param([], {"urls": ["Length must be between 1 and 100."]}, id="none"),
        pytest.param(
            [f"https://recipes.example/{i}" for i in range(101)],
            {"urls": ["Length must be between 1 and 100."]},
            id="over-100",
        ),
        pytest.param(
            ["https://recipes.example/a", "https://recipes.example/b", "ftp://recipes.example/c"],
            # Each problem said once (it was also told "... with a host").
            {"urls": {"2": ["must be an http or https URL"]}},
            id="bad-url-at-2",
        ),
        pytest.param(
            ["https://recipes.example/a", "https://recipes.example/b", "https://recipes.example/a"],
            {"urls": {"2": ["the same URL as item 0"]}},
            id="duplicate",
        ),
    ],
)
def test_a_bad_batch_names_the_item_and_writes_nothing(app, store, auth, urls, fields):
    answer = post_batch(app.test_client(), auth, urls)
    assert answer.status_code == 400
    error = answer.get_json()["error"]
    assert error["code"] == "validation_error"
    assert error["fields"] == fields
    for table in ("jobs", "batches", "batch_jobs", "job_dependencies"):
        assert count(store, table) == 0


def asked_to_confirm(client, auth, job_id):
    """The list job's answer once it waits for the household's confirmation."""
    return wait_for(
        lambda: (
            ((found := job(client, auth, job_id)).get("queue") or {}).get("waiting_for")
            == "household"
            and found
        ),
        timeout=60,
    )


def test_a_list_the_household_confirms_ends_as_they_confirmed_it(app, pages, auth, store):
    client = app.test_client()
    urls = [pages.url(f"/week/{index}") for index in range(3)]
    body = post_batch(client, auth, urls, confirm=True).get_json()
    list_id = body["shopping_list_job_id"]

    asked = asked_to_confirm(client, auth, list_id)
    assert asked["queue"]["signal"] == "confirm"
    merged = asked["result"]
    assert merged["confirmed"] is False
    foods = {item["food"] for item in merged["items"]}
    assert {"olive oil", "burger buns"} <= foods

    # A confirmation that does not fit is refused, naming its field.
    too_many = client.post(
        f"/api/v1/jobs/{list_id}/signals/confirm", json={"add": ["x"] * 201}, headers=auth
    )
    assert too_many.status_code == 400
    assert list(too_many.get_json()["error"]["fields"]) == ["add"]
    answer = client.post(
        f"/api/v1/jobs/{list_id}/signals/confirm",
        json={"remove": ["Olive Oil"], "add": ["kitchen roll", "kitchen roll"]},
        headers=auth,
    )
    assert answer.status_code == 202, answer.get_json()

    done = final_job(client, auth, list_id)
    assert done["status"] == "succeeded", done
    confirmed = done["result"]
    assert confirmed["confirmed"] is True
    rows = [item["text"] for item in confirmed["items"]]
    assert "6 tbsp olive oil" not in rows
    assert rows.count("kitchen roll") == 1
    assert len(rows) == len(merged["items"])  # one out, one in
    assert confirmed["recipes"] == merged["recipes"] == 3
    # The list was merged once, whatever the runs: the step kept it.
    assert sql.scalar(store, "SELECT count(*) FROM job_steps WHERE name = 'merge'") == 1


def test_a_list_nobody_confirms_ends_as_merged(make_app, pages):
    # An app of its own: the module's pool would run the list with its own wait.
    app, auth = started(make_app, SHOPPING_LIST_CONFIRM_SECONDS=0.5)
    client = app.test_client()
    urls = [pages.url(f"/week/{index}") for index in range(2)]
    body = post_batch(client, auth, urls, confirm=True).get_json()
    done = final_job(client, auth, body["shopping_list_job_id"])
    assert (done["status"], done["result"]["confirmed"]) == ("succeeded", False)
    assert done["result"]["recipes"] == 2


def test_confirm_makes_the_list_it_confirms(app, auth):
    answer = post_batch(app.test_client(), auth, ["https://recipes.example/a"], False, confirm=True)
    assert answer.status_code == 202
    assert answer.get_json()["shopping_list_job_id"] is not None


def test_a_batch_over_the_quota_is_refused_whole(make_app, store, auth):
    app = make_app(ALLOW_PRIVATE_URLS=True, JOB_MAX_PENDING_PER_HOUSEHOLD=2)
    urls = [f"https://recipes.example/{i}" for i in range(3)]
    answer = post_batch(app.test_client(), auth, urls)
    assert answer.status_code == 429
    assert answer.get_json()["error"]["code"] == "too_many_jobs"
    assert count(store, "jobs") == 0
    # Two imports fit, with their list beside them.
    assert post_batch(app.test_client(), auth, urls[:2]).status_code == 202
    assert count(store, "jobs") == 3


def test_lines_read_as_sites_write_them():
    read = ingredients.read_line
    assert (read("250g pork mince").food, read("250g pork mince").quantity) == ("pork mince", 250)
    tins = read("2 x 400g tins chopped tomatoes")
    assert (tins.quantity, tins.unit) == (800, "g")
    milk = read("1/2 cup (120 ml) milk")  # the metric amount, as written
    assert (milk.quantity, milk.unit) == (120, "ml")
    eggs = read("3 large eggs")
    assert (eggs.food, eggs.quantity, eggs.unit) == ("eggs", 3, None)
    assert not read("a pinch of salt").summable
    merged = ingredients.merge([("A", ["2 eggs"]), ("B", ["1 large egg", "3 eggs"])])
    assert [(item.food, item.quantity, item.sources) for item in merged] == [
        ("eggs", 6.0, ["A", "B"])
    ]


def rows(*recipes):
    return [item.text for item in ingredients.merge(list(enumerate(recipes)))]


def test_a_list_keeps_the_units_a_cook_measures_with():
    # Two teaspoons of yeast were "9.86 ml yeast".
    assert rows(["2 tsp yeast"]) == ["2 tsp yeast"]
    # A sum keeps the unit its lines share.
    assert rows(["2 tsp yeast"], ["1 tsp yeast"]) == ["3 tsp yeast"]
    # Lines of one kind in different units: the unit most of them used.
    assert rows(["1 tsp yeast"], ["1 tsp yeast", "1 tbsp yeast"]) == ["5 tsp yeast"]
    assert rows(["1 cup milk", "½ cup milk"], ["2 tbsp milk"]) == ["1⅔ cups milk"]
    # Rounded as a kitchen rounds: whole grams past ten, a tenth below;
    # a metric sum past a thousand in the larger unit.
    assert rows(["250g flour"], ["1 kg flour"]) == ["1.25 kg flour"]
    assert rows(["2.5 g dried yeast"]) == ["2.5 g dried yeast"]


def test_a_food_counted_more_than_once_is_plural():
    assert rows(["1 onion"], ["2 onions"]) == ["3 onions"]
    assert rows(["3 egg"]) == ["3 eggs"]
    assert rows(["1 tomato"], ["1 tomato"]) == ["2 tomatoes"]
    assert rows(["½ lemon"]) == ["½ lemon"]


def test_each_food_has_one_row_whatever_its_lines_units():
    merged = ingredients.merge(
        [("A", ["300 g flour", "1 tsp salt"]), ("B", ["1 1/2 cups flour", "salt to taste"])]
    )
    assert [(item.food, item.text, item.sources) for item in merged] == [
        ("flour", "300 g + 1½ cups flour", ["A", "B"]),
        ("salt", "1 tsp salt (also: salt to taste)", ["A", "B"]),
    ]
    flour = merged[0].as_dict()
    assert flour["amounts"] == [{"quantity": 300, "unit": "g"}, {"quantity": 1.5, "unit": "cup"}]
    assert (flour["quantity"], flour["unit"]) == (300, "g")


@pytest.mark.parametrize(
    "line",
    [
        "2 nan breads",  # naan, as often spelt: "nan" is no number
        "nan cups milk",
        "1/0 cup milk",
        "1e308 kg flour",  # past a float once in grams
        "9" * 400 + " g flour",
        "2000 kg flour",  # finite, but no shopping
    ],
)
def test_a_line_that_cannot_be_read_is_listed_as_written(line):
    merged = ingredients.merge([("A", [line, "2 eggs"]), ("B", ["1 egg"])])
    # The line as written, a row of its own (of its food, when the model
    # told one: then first, where that food first appears).
    assert sorted((item.text, item.quantity, item.unit) for item in merged) == sorted(
        [("3 eggs", 3.0, None), (line, None, None)]
    )


@pytest.mark.parametrize("character", [",", "*", "/", "½", "1 "])
def test_a_line_of_too_many_tokens_is_not_given_to_the_model(character):
    line = character * 500
    reading = ingredients.read_line(line)
    written = line.strip()[: ingredients.MAX_LINE_CHARS]
    assert (reading.text, reading.food, reading.summable) == (written, None, False)
    # Below the bound, the model reads it.
    assert ingredients.read_line("salt, " * 29).food == "salt"


def distinct_word(number: int) -> str:
    return "".join(string.ascii_lowercase[number // 26**place % 26] for place in range(3))


# Lines the model reads at its slowest below the token bound (about 15 ms
# each here), as many as a list reads: a list that takes half a minute.
# Each differs: the model keeps what it read of a line it has seen.
SLOW_LINES = [f"{distinct_word(n)} " + "salt, " * 28 for n in range(ingredients.MAX_LINES)]


def slow_week(pages: PageServer) -> list[str]:
    per_page = 300  # a page's parse keeps at most this many lines
    urls = []
    for index in range(0, len(SLOW_LINES), per_page):
        path = f"/slow/{index}"
        lines = SLOW_LINES[index : index + per_page]
        pages.page(path, recipe_page(f"Salted {index}", recipeIngredient=lines))
        urls.append(pages.url(path))
    return urls


def list_process(client, auth, list_job: str) -> int:
    """The pid of the parser process reading the list's lines (waits for it)."""
    wait_for(lambda: job(client, auth, list_job)["status"] == "running", timeout=60)
    return wait_for(lambda: (pids := parser_pool.shared().busy_pids()) and pids[0], timeout=60)


def started(make_app, **config) -> tuple[Flask, dict[str, str]]:
    """An app with its pool started, and a household's header: the module's
    `app` (which `auth` needs) would run a second pool, with its own settings."""
    app = make_app(ALLOW_PRIVATE_URLS=True, **FETCH_CONFIG, **config)
    get_jobs(app).start_pool()
    token = create_household(get_store(app), "The Smiths").token
    return app, {"Authorization": f"Bearer {token}"}


def test_a_list_past_its_time_fails_and_its_process_is_killed(make_app, pages, logs):
    app, auth = started(make_app, SHOPPING_LIST_SECONDS=1.0)
    client = app.test_client()
    body = post_batch(client, auth, slow_week(pages)).get_json()
    pid = list_process(client, auth, body["shopping_list_job_id"])

    list_job = final_job(client, auth, body["shopping_list_job_id"])
    assert (list_job["status"], list_job["error"]) == ("failed", TOO_SLOW)
    wait_for(lambda: not Path(f"/proc/{pid}").exists())
    assert "shopping list could not be made: past its time limit (1 s)" in logs.text


def test_a_cancelled_list_stops_using_cpu_at_once(make_app, pages):
    app, auth = started(make_app, JOB_KILL_GRACE_SECONDS=0.2)
    client = app.test_client()
    body = post_batch(client, auth, slow_week(pages)).get_json()
    list_job = body["shopping_list_job_id"]
    pid = list_process(client, auth, list_job)
    wait_for(lambda: process_state(pid) == "R")

    assert client.post(f"/api/v1/jobs/{list_job}/cancel", headers=auth).status_code == 202
    wait_for(lambda: job(client, auth, list_job)["status"] == "cancelled")
    wait_for(lambda: not Path(f"/proc/{pid}").exists())


def post_keyed_batch(client, auth, key, urls, shopping_list=True):
    return client.post(
        "/api/v1/recipe-imports/batch",
        json={"urls": urls, "shopping_list": shopping_list},
        headers={**auth, "Idempotency-Key": key},
    )


def unstarted(make_app) -> tuple[Flask, Store, dict[str, str]]:
    """An app whose pool is not started (nothing runs, nothing is fetched), its
    store, and a household's header (the module's `app`, which `auth` needs,
    would start a pool)."""
    app = make_app(ALLOW_PRIVATE_URLS=True)
    store = get_store(app)
    token = create_household(store, "The Smiths").token
    return app, store, {"Authorization": f"Bearer {token}"}


def test_a_batch_repeated_with_its_key_is_the_same_batch(make_app):
    app, store, auth = unstarted(make_app)
    client = app.test_client()
    urls = [f"https://recipes.example/{i}" for i in range(3)]
    first = post_keyed_batch(client, auth, "week-49", urls)
    assert first.status_code == 202, first.get_json()

    again = post_keyed_batch(client, auth, "week-49", urls)
    assert again.status_code == 200, again.get_json()
    assert again.get_json() == first.get_json()
    assert again.headers["Location"] == first.headers["Location"]
    assert (count(store, "batches"), count(store, "jobs")) == (1, 4)

    # The key with another batch is refused, and writes nothing.
    for other in (urls[:2], [*urls[:2], "https://recipes.example/9"]):
        reused = post_keyed_batch(client, auth, "week-49", other)
        assert reused.status_code == 422
        assert reused.get_json()["error"]["code"] == "idempotency_key_reused"
    reused = post_keyed_batch(client, auth, "week-49", urls, shopping_list=False)
    assert reused.status_code == 422
    assert (count(store, "batches"), count(store, "jobs")) == (1, 4)

    # Another key makes another batch.
    assert post_keyed_batch(client, auth, "week-50", urls).status_code == 202
    assert count(store, "batches") == 2


@pytest.mark.parametrize("key", ["", "x" * 256, "two words", "caf\u00e9"])
def test_a_batch_with_a_malformed_key_is_refused_and_writes_nothing(make_app, key):
    app, store, auth = unstarted(make_app)
    client = app.test_client()
    answer = post_keyed_batch(client, auth, key, ["https://recipes.example/a"])
    assert answer.status_code == 400
    error = answer.get_json()["error"]
    assert error["code"] == "validation_error"
    assert list(error["fields"]) == ["Idempotency-Key"]
    assert count(store, "jobs") == 0
