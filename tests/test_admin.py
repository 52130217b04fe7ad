"""The dashboard at /admin/ through Flask's test client, on both databases:
who is refused (no credentials, a household's token, a revoked or expired
operator), CSRF on every POST, the session cookie's flags, what the pages
show (never a payload URL's query), and the actions. The real browser drives
it in tests/test_dashboard_browser.py."""

from __future__ import annotations

import hashlib
import os
import re
import socket

import pytest

from mealquest.admin.sessions import MAX_SESSIONS_PER_OPERATOR
from mealquest.model.jobs import Status
from mealquest.operators import create_operator, revoke_operator
from tests.conftest import wait_for
from tests.support import sql
from tests.support.kinds import SECRET

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

SECRET_KEY = "test-secret-key-" + "k" * 32
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def admin_app(make_app):
    return make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY)


@pytest.fixture
def admin_store(admin_app):
    from mealquest.extensions import get_store

    return get_store(admin_app)


@pytest.fixture
def admin_jobs(admin_app):
    from mealquest.jobs.service import get_jobs

    return get_jobs(admin_app)


@pytest.fixture
def operator(admin_store):
    return create_operator(admin_store, "Ada")


@pytest.fixture
def some_household(admin_store):
    from mealquest.households import create_household

    return create_household(admin_store, "The Smiths")


def csrf_of(page) -> str:
    return _CSRF.search(page.get_data(as_text=True)).group(1)


def signed_in(app, token, headers=None, https=False):
    client = app.test_client()
    base_url = "https://localhost" if https else "http://localhost"
    form = client.get("/admin/sign-in", headers=headers, base_url=base_url)
    # Over HTTPS, Flask-WTF also wants the form to come from this site.
    referer = {"Referer": "https://localhost/admin/sign-in"}
    answer = client.post(
        "/admin/sign-in",
        data={"token": token, "csrf_token": csrf_of(form)},
        headers={**(headers or {}), **referer},
        base_url=base_url,
    )
    assert answer.status_code == 303, answer.get_data(as_text=True)
    return client, answer


def post(client, path, page_path):
    """A POST with the CSRF token of the page it is on."""
    return client.post(path, data={"csrf_token": csrf_of(client.get(page_path))})


def enqueue(jobs, household, kind="succeed", payload=None):
    return jobs.enqueue(kind, payload or {"value": 1}, household_id=household.household_id)


def force_failed(store, job_id):
    sql.execute(
        store,
        "UPDATE jobs SET status = 'failed', attempt = 1, error = 'boom', "
        "finished_at = updated_at WHERE id = ?",
        (job_id,),
    )


def routes(job_id):
    pages = ["/admin/", "/admin/jobs", f"/admin/jobs/{job_id}", "/admin/static/refresh.js"]
    pages += [
        "/admin/?range=day",
        "/admin/households",
        "/admin/households/1/erase",
        "/admin/audit",
        "/admin/processes",
        "/admin/jobs/bulk?action=retry&status=failed",
    ]
    posts = [f"/admin/jobs/{job_id}/{action}" for action in ("retry", "cancel", "delete")]
    posts += ["/admin/jobs/bulk"]
    posts += [f"/admin/households/1/{action}" for action in ("suspend", "resume", "erase")]
    return pages, [*posts, "/admin/kinds/pause", "/admin/kinds/resume", "/admin/sign-out"]


def assert_refused(client, job_id, headers=None):
    pages, posts = routes(job_id)
    for path in pages:
        answer = client.get(path, headers=headers)
        assert answer.status_code == 302, path
        assert answer.headers["Location"].endswith("/admin/sign-in")
        assert job_id not in answer.get_data(as_text=True)
    for path in posts:
        answer = client.post(path, headers=headers)
        assert answer.status_code == 401, path


# -- who is refused ---------------------------------------------------------------------------


def test_every_admin_route_refuses_no_credentials_and_a_household_token(
    admin_app, admin_store, admin_jobs, some_household
):
    job_id = enqueue(admin_jobs, some_household)
    force_failed(admin_store, job_id)
    client = admin_app.test_client()
    assert_refused(client, job_id)
    # A household's bearer token is no way in, nor a sign-in.
    assert_refused(client, job_id, headers={"Authorization": f"Bearer {some_household.token}"})
    form = client.get("/admin/sign-in")
    answer = client.post(
        "/admin/sign-in", data={"token": some_household.token, "csrf_token": csrf_of(form)}
    )
    assert answer.status_code == 401
    assert "not a live operator token" in answer.get_data(as_text=True)
    assert_refused(client, job_id)
    assert sql.scalar(admin_store, "SELECT status FROM jobs WHERE id = ?", (job_id,)) == "failed"


def test_a_revoked_operator_is_signed_out_at_once(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    job_id = enqueue(admin_jobs, some_household)
    force_failed(admin_store, job_id)
    client, _ = signed_in(admin_app, operator.token)
    page = client.get(f"/admin/jobs/{job_id}")
    assert page.status_code == 200
    revoke_operator(admin_store, operator.operator_id)
    answer = client.post(f"/admin/jobs/{job_id}/retry", data={"csrf_token": csrf_of(page)})
    assert answer.status_code == 401
    assert_refused(client, job_id)
    assert sql.scalar(admin_store, "SELECT status FROM jobs WHERE id = ?", (job_id,)) == "failed"
    # Nor can the revoked token sign in again.
    form = client.get("/admin/sign-in")
    again = client.post(
        "/admin/sign-in", data={"token": operator.token, "csrf_token": csrf_of(form)}
    )
    assert again.status_code == 401


def test_an_expired_sign_in_is_refused(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    job_id = enqueue(admin_jobs, some_household)
    client, _ = signed_in(admin_app, operator.token)
    assert client.get("/admin/").status_code == 200
    # Its time is up (as MEALQUEST_DASHBOARD_SESSION_HOURS after its sign-in).
    sql.execute(admin_store, "UPDATE dashboard_sessions SET expires_at = created_at")
    assert_refused(client, job_id)


def session_cookie(client):
    return client.get_cookie("mealquest_admin", path="/admin").value


def replayed(app, cookie):
    """A new client (another browser, another machine) with a copied cookie."""
    thief = app.test_client()
    thief.set_cookie("mealquest_admin", cookie, path="/admin")
    return thief


def test_a_cookie_copied_before_sign_out_opens_nothing_after_it(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    job_id = enqueue(admin_jobs, some_household)
    client, _ = signed_in(admin_app, operator.token)
    copied = session_cookie(client)
    assert replayed(admin_app, copied).get("/admin/").status_code == 200
    assert post(client, "/admin/sign-out", "/admin/").status_code == 303
    assert_refused(replayed(admin_app, copied), job_id)
    assert sql.scalar(admin_store, "SELECT count(*) FROM dashboard_sessions") == 0


def test_revoking_the_operator_ends_every_session_of_it(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    job_id = enqueue(admin_jobs, some_household)
    other = create_operator(admin_store, "Grace")
    copies = [session_cookie(signed_in(admin_app, operator.token)[0]) for _ in range(2)]
    others = session_cookie(signed_in(admin_app, other.token)[0])
    result = admin_app.test_cli_runner().invoke(
        args=["operators", "revoke", str(operator.operator_id)]
    )
    assert result.exit_code == 0, result.output
    for copied in copies:
        assert_refused(replayed(admin_app, copied), job_id)
    # Its rows went with it; another operator's session stays.
    assert sql.scalar(admin_store, "SELECT count(*) FROM dashboard_sessions") == 1
    assert replayed(admin_app, others).get("/admin/").status_code == 200


def test_the_cookie_carries_a_random_session_id_stored_only_as_a_digest(
    admin_app, admin_store, operator
):
    client, _ = signed_in(admin_app, operator.token)
    with client.session_transaction("/admin/") as session:
        values = dict(session)
    # The signed cookie holds the session's id (and Flask-WTF's CSRF secret): no
    # operator, no time, nothing a copy could be changed into.
    assert set(values) <= {"session_id", "csrf_token"}
    session_id = values["session_id"]
    assert len(session_id) >= 40
    [row] = sql.rows(admin_store, "SELECT * FROM dashboard_sessions")
    assert row["id_sha256"] == hashlib.sha256(session_id.encode()).hexdigest()
    assert row["operator_id"] == operator.operator_id
    assert session_id not in str(row)


def test_a_sign_in_cleans_expired_sessions_and_keeps_a_bounded_number(
    admin_app, admin_store, operator
):
    signed_in(admin_app, operator.token)
    sql.execute(admin_store, "UPDATE dashboard_sessions SET expires_at = created_at")
    signed_in(admin_app, operator.token)
    assert sql.scalar(admin_store, "SELECT count(*) FROM dashboard_sessions") == 1
    for _ in range(MAX_SESSIONS_PER_OPERATOR + 3):
        signed_in(admin_app, operator.token)
    assert (
        sql.scalar(admin_store, "SELECT count(*) FROM dashboard_sessions")
        == MAX_SESSIONS_PER_OPERATOR
    )


def test_a_forged_session_cookie_is_refused(admin_app, admin_jobs, some_household, operator):
    job_id = enqueue(admin_jobs, some_household)
    client = admin_app.test_client()
    client.set_cookie("mealquest_admin", "eyJvcGVyYXRvcl9pZCI6MX0.forged.signature", path="/admin")
    assert_refused(client, job_id)


def test_the_dashboard_is_absent_unless_turned_on(make_app):
    client = make_app().test_client()
    assert client.get("/admin/").status_code == 404
    assert client.get("/admin/sign-in").status_code == 404


# -- CSRF -------------------------------------------------------------------------------------


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused_and_changes_nothing(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    failed = enqueue(admin_jobs, some_household)
    force_failed(admin_store, failed)
    client, _ = signed_in(admin_app, operator.token)
    other, _ = signed_in(admin_app, operator.token)
    others_token = csrf_of(other.get("/admin/"))
    for action in ("retry", "delete", "cancel"):
        path = f"/admin/jobs/{failed}/{action}"
        for data in ({}, {"csrf_token": "wrong"}, {"csrf_token": others_token}):
            answer = client.post(path, data=data)
            assert answer.status_code == 400, (action, data)
            assert "The form expired" in answer.get_data(as_text=True)
    assert sql.scalar(admin_store, "SELECT status FROM jobs WHERE id = ?", (failed,)) == "failed"
    # Sign-out and sign-in forms too.
    assert client.post("/admin/sign-out").status_code == 400
    assert client.get("/admin/").status_code == 200
    fresh = admin_app.test_client()
    assert fresh.post("/admin/sign-in", data={"token": operator.token}).status_code == 400
    # With the page's own token, the action goes through.
    answer = post(client, f"/admin/jobs/{failed}/retry", f"/admin/jobs/{failed}")
    assert answer.status_code == 303
    assert sql.scalar(admin_store, "SELECT status FROM jobs WHERE id = ?", (failed,)) == "queued"


# -- the session cookie -----------------------------------------------------------------------


def _cookie_flags(answer):
    [cookie] = [c for c in answer.headers.getlist("Set-Cookie") if c.startswith("mealquest_admin=")]
    return {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}


def test_the_session_cookie_is_httponly_samesite_strict_scoped_and_secure_over_tls(
    make_app, admin_app, operator
):
    _, plain = signed_in(admin_app, operator.token)
    flags = _cookie_flags(plain)
    assert "httponly" in flags
    assert flags["samesite"] == "SameSite=Strict"
    assert flags["path"] == "Path=/admin"
    assert "secure" not in flags
    # Over TLS to the app itself...
    _, direct = signed_in(admin_app, operator.token, https=True)
    assert "secure" in _cookie_flags(direct)
    # ...or through the trusted proxy, which says so in X-Forwarded-Proto.
    https = {"X-Forwarded-Proto": "https"}
    proxied_app = make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY, PROXY_FIX_HOPS=1)
    _, proxied = signed_in(proxied_app, operator.token, headers=https)
    assert "secure" in _cookie_flags(proxied)
    # A client's own X-Forwarded-Proto is not trusted without the proxy setting.
    _, spoofed = signed_in(admin_app, operator.token, headers=https)
    assert "secure" not in _cookie_flags(spoofed)


def test_sign_out_ends_the_session(admin_app, admin_jobs, some_household, operator):
    job_id = enqueue(admin_jobs, some_household)
    client, _ = signed_in(admin_app, operator.token)
    answer = post(client, "/admin/sign-out", "/admin/")
    assert answer.status_code == 303
    assert_refused(client, job_id)


def test_pages_forbid_framing_and_caching(admin_app, operator):
    client, _ = signed_in(admin_app, operator.token)
    answer = client.get("/admin/")
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert answer.headers["Cache-Control"] == "no-store"
    assert "script-src 'self'" in answer.headers["Content-Security-Policy"]


# -- pages ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"https://recipes.example/soup?token={SECRET}&x=1#frag-{SECRET}",
        # A quote is a character a URL may hold: the secret after it is masked too.
        f"https://recipes.example/soup?x=1'&token={SECRET}&x=1#frag-{SECRET}",
    ],
    ids=["plain", "quote"],
)
def test_no_page_shows_a_payload_urls_query(
    admin_app, admin_store, admin_jobs, some_household, operator, url
):
    job_id = enqueue(admin_jobs, some_household, "raise_secret_error", {"secret": url})
    publishing = enqueue(admin_jobs, some_household, "wait_for_gate", {"url": url})
    sql.execute(
        admin_store,
        "UPDATE jobs SET result = ?, status = 'failed', attempt = 1, error = ?, "
        "finished_at = updated_at WHERE id = ?",
        (f'{{"seen": "{url}"}}', f"fetching {url} failed", publishing),
    )
    admin_jobs.start_pool()
    wait_for(lambda: admin_jobs.get(job_id).status == Status.FAILED)
    client, _ = signed_in(admin_app, operator.token)
    for path in (
        "/admin/",
        "/admin/jobs",
        "/admin/jobs?status=failed",
        f"/admin/jobs/{job_id}",
        f"/admin/jobs/{publishing}",
    ):
        text = client.get(path).get_data(as_text=True)
        assert SECRET not in text, path
    page = client.get(f"/admin/jobs/{publishing}").get_data(as_text=True)
    masked = (
        url.split("?")[0]
        + "?"
        + "&amp;".join(
            pair.split("=")[0] + "=***" for pair in url.split("?")[1].split("#")[0].split("&")
        )
    )
    assert masked.replace("'", "&#39;") + "#***" in page


def test_the_overview_counts_by_status_and_kind(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    oldest = enqueue(admin_jobs, some_household)
    enqueue(admin_jobs, some_household)
    failed = enqueue(admin_jobs, some_household, "sleep", {"seconds": 0})
    force_failed(admin_store, failed)
    # A kind this release has no handler for (a newer release's).
    sql.execute(admin_store, "UPDATE jobs SET kind = 'from_the_future' WHERE id = ?", (failed,))
    orphan = enqueue(admin_jobs, some_household)
    sql.execute(admin_store, "UPDATE jobs SET kind = 'from_the_future' WHERE id = ?", (orphan,))
    client, _ = signed_in(admin_app, operator.token)
    text = client.get("/admin/").get_data(as_text=True)
    assert re.search(r'id="count-queued">3<', text)
    assert re.search(r'id="count-failed">1<', text)
    assert re.search(r'id="throughput">1<', text)
    assert f"/admin/jobs/{oldest}" in text
    assert "1 queued from_the_future" in text


@pytest.mark.parametrize("page", ["/admin/", "/admin/processes"])
def test_the_overview_and_the_processes_page_list_the_live_processes(
    admin_app, admin_jobs, operator, page
):
    client, _ = signed_in(admin_app, operator.token)
    assert 'id="no-processes"' in client.get(page).get_data(as_text=True)
    admin_jobs.start_pool()
    pool = admin_jobs.pool

    def listed():
        text = client.get(page).get_data(as_text=True)
        return f'id="process-{pool.owner}"' in text and text

    text = wait_for(listed)
    row = re.search(rf'id="process-{pool.owner}">(.*?)</tr>', text, re.S).group(1)
    assert f">{socket.gethostname()}<" in row
    assert f">{os.getpid()}<" in row
    assert f">{admin_app.config['JOB_WORKERS']}<" in row  # its slots
    assert "succeed" in row  # among the kinds it runs
    pool.stop(timeout=5)
    wait_for(lambda: 'id="no-processes"' in client.get(page).get_data(as_text=True))


def test_the_jobs_list_filters_and_pages_by_keyset(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    from mealquest.households import create_household

    other = create_household(admin_store, "The Joneses")
    mine = [enqueue(admin_jobs, some_household) for _ in range(55)]
    theirs = enqueue(admin_jobs, other, "sleep", {"seconds": 0})
    force_failed(admin_store, theirs)
    client, _ = signed_in(admin_app, operator.token)

    def listed(query):
        answer = client.get(f"/admin/jobs{query}")
        text = answer.get_data(as_text=True)
        return answer.status_code, re.findall(r'href="/admin/jobs/([0-9a-f]{32})"', text), text

    status, ids, text = listed("")
    assert status == 200
    assert ids == [theirs, *reversed(mine)][:50]
    older = re.search(r'href="(/admin/jobs\?[^"]*before=\d+[^"]*)" id="older"', text).group(1)
    _, page_two, text = listed(older.replace("/admin/jobs", "").replace("&amp;", "&"))
    assert page_two == list(reversed(mine))[49:]
    assert 'id="older"' not in text
    assert listed("?status=failed")[1] == [theirs]
    assert listed("?kind=sleep")[1] == [theirs]
    assert listed(f"?household={other.household_id}")[1] == [theirs]
    assert listed(f"?household={other.household_id}&status=queued")[1] == []
    for bad in (
        "?status=lost",
        "?household=abc",
        "?household=-1",
        "?before=x",
        "?household=\u0663",
    ):
        status, ids, text = listed(bad)
        assert status == 400, bad
        assert ids == []
        assert 'id="problem"' in text


def test_a_jobs_page_shows_every_field(admin_app, admin_jobs, some_household, operator):
    job_id = enqueue(admin_jobs, some_household, "fail_with_failure", {"message": "no soup"})
    admin_jobs.start_pool()
    wait_for(lambda: admin_jobs.get(job_id).status == Status.FAILED)
    client, _ = signed_in(admin_app, operator.token)
    text = client.get(f"/admin/jobs/{job_id}").get_data(as_text=True)
    job = admin_jobs.get(job_id)
    for name in (
        "id",
        "seq",
        "household_id",
        "kind",
        "status",
        "attempt",
        "max_attempts",
        "run_at",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "on_interrupt",
        "interruptions",
        "snoozes",
    ):
        assert f'id="field-{name}">{getattr(job, name)}<' in text, name
    assert "no soup" in text
    assert 'id="retry"' in text
    assert client.get("/admin/jobs/nope").status_code == 404


# -- actions ----------------------------------------------------------------------------------


def test_a_kind_is_paused_and_resumed_from_the_overview_by_an_operator(
    admin_app, admin_store, admin_jobs, some_household, operator, logs
):
    job_id = enqueue(admin_jobs, some_household)
    client, _ = signed_in(admin_app, operator.token)
    overview = client.get("/admin/").get_data(as_text=True)
    assert "taking its jobs" in overview
    assert "paused</span>" not in overview

    # Without the page's CSRF token, nothing is paused.
    assert client.post("/admin/kinds/pause", data={"kind": "succeed"}).status_code == 400
    assert sql.rows(admin_store, "SELECT kind FROM paused_kinds") == []
    answer = client.post(
        "/admin/kinds/pause", data={"kind": "succeed", "csrf_token": csrf_of(client.get("/admin/"))}
    )

    assert answer.status_code == 303
    assert answer.headers["Location"].endswith("/admin/")
    page = client.get("/admin/").get_data(as_text=True)
    assert "succeed: paused: no process claims its jobs" in page
    assert f"by operator {operator.operator_id}" in page
    assert 'class="resume"' in page
    [row] = sql.rows(admin_store, "SELECT kind, operator_id FROM paused_kinds")
    assert row == {"kind": "succeed", "operator_id": operator.operator_id}
    [record] = [r for r in logs.records if getattr(r, "operator_id", None) == operator.operator_id]
    assert record.kind == "succeed"
    assert record.getMessage() == f"operator {operator.operator_id}: pause a kind: paused"
    # Its queued job's page says why it waits.
    assert "Waiting: Its kind is paused" in client.get(f"/admin/jobs/{job_id}").get_data(
        as_text=True
    )

    admin_jobs.start_pool()
    resumed = post(client, "/admin/kinds/resume", "/admin/")
    assert resumed.status_code == 400  # no kind named
    answer = client.post(
        "/admin/kinds/resume",
        data={"kind": "succeed", "csrf_token": csrf_of(client.get("/admin/"))},
    )
    assert answer.status_code == 303
    assert "succeed: resumed" in client.get("/admin/").get_data(as_text=True)
    wait_for(lambda: admin_jobs.get(job_id).status == Status.SUCCEEDED)
    assert sql.rows(admin_store, "SELECT kind FROM paused_kinds") == []
    # Both are in the audit log, with who took them.
    audited = sql.rows(
        admin_store,
        "SELECT actor, action, target, count FROM audit_log "
        "WHERE action IN ('pause', 'resume') ORDER BY seq",
    )
    assert audited == [
        {"actor": "Ada", "action": "pause", "target": "kind succeed", "count": 1},
        {"actor": "Ada", "action": "resume", "target": "kind succeed", "count": 1},
    ]


def test_only_a_kind_this_release_runs_is_paused_from_the_dashboard(
    admin_app, admin_store, operator
):
    client, _ = signed_in(admin_app, operator.token)
    for kind in ("no_such_kind", "", "x" * 5_000):
        answer = client.post(
            "/admin/kinds/pause", data={"kind": kind, "csrf_token": csrf_of(client.get("/admin/"))}
        )
        assert answer.status_code == 400, kind
    assert sql.rows(admin_store, "SELECT kind FROM paused_kinds") == []


def test_a_queued_jobs_page_says_its_partition_is_at_its_limit_or_its_rate(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    from mealquest.model.jobs import ClaimRequest

    # An hour's window: the partition is still full when the page is read.
    first, second, third = (
        admin_jobs.enqueue("rated_hourly", {"key": "p"}, household_id=some_household.household_id)
        for _ in range(3)
    )
    limits = admin_jobs.registry.partition_limits()
    started = admin_store.write(
        admin_store.jobs.claim,
        ClaimRequest(
            owner="w.1", lease_seconds=60, limit=3, kinds=("rated_hourly",), partitions=limits
        ),
    )
    assert {job.id for job in started} == {first, second}
    client, _ = signed_in(admin_app, operator.token)

    text = client.get(f"/admin/jobs/{third}").get_data(as_text=True)

    assert "Waiting: Its partition p started 2 jobs in 3600 s, as many as its rate allows" in text
    assert 'id="field-partition_key">p<' in text
    assert "Waiting:" not in client.get(f"/admin/jobs/{first}").get_data(as_text=True)
    running, waiting = (
        admin_jobs.enqueue("one_per_key", {"key": "q"}, household_id=some_household.household_id)
        for _ in range(2)
    )
    [taken] = admin_store.write(
        admin_store.jobs.claim,
        ClaimRequest(
            owner="w.2", lease_seconds=60, limit=2, kinds=("one_per_key",), partitions=limits
        ),
    )
    assert taken.id == running
    text = client.get(f"/admin/jobs/{waiting}").get_data(as_text=True)
    assert "Waiting: Its partition q has 1 jobs running, its limit of 1." in text


def test_retry_queues_a_failed_job_afresh_and_it_runs_again(
    admin_app, admin_store, admin_jobs, some_household, operator, logs
):
    job_id = enqueue(admin_jobs, some_household)
    force_failed(admin_store, job_id)
    client, _ = signed_in(admin_app, operator.token)
    admin_jobs.start_pool()
    answer = post(client, f"/admin/jobs/{job_id}/retry", f"/admin/jobs/{job_id}")
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith(f"/admin/jobs/{job_id}")
    job = wait_for(lambda: (j := admin_jobs.get(job_id)).status == Status.SUCCEEDED and j)
    assert job.attempt == 1
    assert job.error is None
    [record] = [r for r in logs.records if getattr(r, "operator_id", None) == operator.operator_id]
    assert record.job_id == job_id
    assert record.getMessage() == f"operator {operator.operator_id}: retry the job: retried"
    # A job that is not failed is not retried.
    again = post(client, f"/admin/jobs/{job_id}/retry", f"/admin/jobs/{job_id}")
    assert again.status_code == 303
    assert "Not possible" in client.get(f"/admin/jobs/{job_id}").get_data(as_text=True)


def test_delete_removes_a_job_that_is_not_running(
    admin_app, admin_store, admin_jobs, some_household, operator
):
    job_id = enqueue(admin_jobs, some_household)
    running = enqueue(admin_jobs, some_household)
    sql.execute(
        admin_store,
        "UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'x', "
        "lease_expires_at = run_at WHERE id = ?",
        (running,),
    )
    client, _ = signed_in(admin_app, operator.token)
    answer = post(client, f"/admin/jobs/{job_id}/delete", f"/admin/jobs/{job_id}")
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith("/admin/jobs")
    assert admin_jobs.get(job_id) is None
    refused = post(client, f"/admin/jobs/{running}/delete", "/admin/")
    assert refused.status_code == 303
    assert admin_jobs.get(running) is not None


def test_a_live_refresh_leaves_the_flashed_answer_to_the_page_being_loaded(
    admin_app, admin_jobs, some_household, operator
):
    # A job's page refreshes itself at each event of its stream, and a cancel
    # makes one: the refresh that raced the click's redirect took its
    # message (a browser test saw "Cancel requested" never shown, under load).
    queued = enqueue(admin_jobs, some_household)
    client, _ = signed_in(admin_app, operator.token)
    post(client, f"/admin/jobs/{queued}/cancel", f"/admin/jobs/{queued}")
    refreshed = client.get(f"/admin/jobs/{queued}", headers={"X-Live-Refresh": "1"})
    assert 'id="live"' in refreshed.get_data(as_text=True)
    assert 'id="flash"' not in refreshed.get_data(as_text=True)
    loaded = client.get(f"/admin/jobs/{queued}").get_data(as_text=True)
    assert 'id="flash"' in loaded


def test_cancel_cancels_a_queued_job_and_refuses_a_finished_one(
    admin_app, admin_store, admin_jobs, some_household, operator, logs
):
    queued = enqueue(admin_jobs, some_household)
    failed = enqueue(admin_jobs, some_household)
    force_failed(admin_store, failed)
    client, _ = signed_in(admin_app, operator.token)
    answer = post(client, f"/admin/jobs/{queued}/cancel", f"/admin/jobs/{queued}")
    assert answer.status_code == 303
    assert admin_jobs.get(queued).status == Status.CANCELLED
    [record] = [r for r in logs.records if getattr(r, "operator_id", None) == operator.operator_id]
    assert record.getMessage() == f"operator {operator.operator_id}: cancel the job: cancelled"
    refused = post(client, f"/admin/jobs/{failed}/cancel", f"/admin/jobs/{failed}")
    assert refused.status_code == 303
    assert admin_jobs.get(failed).status == Status.FAILED
    assert "Not possible" in client.get(f"/admin/jobs/{failed}").get_data(as_text=True)
    # A cancelled job may be retried: queued again, it runs.
    admin_jobs.start_pool()
    post(client, f"/admin/jobs/{queued}/retry", f"/admin/jobs/{queued}")
    wait_for(lambda: admin_jobs.get(queued).status == Status.SUCCEEDED)
