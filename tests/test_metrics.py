"""GET /metrics: operators only, exactly the documented series, the runner's
outcomes counted where they are recorded, routes labelled by URL rule, queue
figures cached, and the port of its own for `flask jobs work`. On both
databases. (Counting across gunicorn workers: tests/serving/test_metrics_gunicorn.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import gevent
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from mealquest.config import ConfigError
from mealquest.jobs.runner.metrics import AttemptMetrics
from mealquest.jobs.runner.outcome import Outcome
from mealquest.jobs.runner.running import Running
from mealquest.metrics import standalone
from mealquest.model.jobs import Lease, Status
from mealquest.operators import create_operator, revoke_operator
from mealquest.queue_stats import CachedFigures
from tests.conftest import wait_for
from tests.support import sql
from tests.support.rescue import rescue_all

pytestmark = pytest.mark.both_databases

NAMES = {
    "mealquest_jobs",
    "mealquest_job_oldest_due_age_seconds",
    "mealquest_job_runs",
    "mealquest_job_run_duration_seconds",
    "mealquest_job_wait_seconds",
    "mealquest_job_rescues",
    "mealquest_http_requests",
    "mealquest_http_request_duration_seconds",
    "mealquest_kind_paused",
    "mealquest_jobs_waiting_for_household",
    "mealquest_jobs_waiting_for_household_next_timeout_seconds",
}


@pytest.fixture
def operator(store):
    return create_operator(store, "Ada")


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def scrape(client, operator):
    answer = client.get("/metrics", headers=bearer(operator.token))
    assert answer.status_code == 200
    assert answer.content_type.startswith("text/plain; version=0.0.4")
    return answer.get_data(as_text=True)


def samples(text):
    """{(sample name, frozenset of labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text, name, **labels):
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def test_metrics_refuses_anyone_but_a_live_operator(client, store, household, operator):
    revoked = create_operator(store, "Gone")
    revoke_operator(store, revoked.operator_id)
    for headers in (
        {},
        bearer(household.token),
        bearer(revoked.token),
        bearer("mqop_not-a-token"),
        {"Authorization": f"Basic {operator.token}"},
    ):
        for method in ("GET", "OPTIONS", "HEAD"):
            answer = client.open("/metrics", method=method, headers=headers)
            assert answer.status_code == 401, (method, headers)
            if method != "HEAD":
                assert answer.json == {
                    "error": {
                        "code": "unauthorized",
                        "message": "a valid operator token is required",
                    }
                }
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_metrics_has_exactly_the_documented_names_and_labels(
    app, client, jobs, household, operator
):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    pool = jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    pool.stop(timeout=1)  # records the run's outcome before it returns
    jobs.enqueue("succeed", {"value": 2}, household_id=household.household_id)
    assert client.get("/healthz").status_code == 200
    text = scrape(client, operator)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) >= NAMES
    # Only ours, no `_created` series.
    assert not [name for name in families if not name.startswith("mealquest_")]
    assert "_created" not in text
    labels = {
        name: {key for sample in family.samples for key in sample.labels if key != "le"}
        for name, family in families.items()
        if name in NAMES
    }
    assert labels == {
        "mealquest_jobs": {"kind", "status"},
        "mealquest_job_oldest_due_age_seconds": {"kind"},
        "mealquest_job_runs": {"kind", "outcome"},
        "mealquest_job_run_duration_seconds": {"kind"},
        "mealquest_job_wait_seconds": {"kind"},
        "mealquest_job_rescues": set(),
        "mealquest_http_requests": {"route", "method", "status"},
        "mealquest_http_request_duration_seconds": {"route"},
        "mealquest_kind_paused": {"kind"},
        "mealquest_jobs_waiting_for_household": set(),
        "mealquest_jobs_waiting_for_household_next_timeout_seconds": set(),
    }
    assert families["mealquest_job_run_duration_seconds"].type == "histogram"
    assert families["mealquest_job_wait_seconds"].type == "histogram"
    assert families["mealquest_http_request_duration_seconds"].type == "histogram"
    assert families["mealquest_jobs"].type == "gauge"
    assert value(text, "mealquest_jobs", kind="succeed", status="succeeded") == 1
    assert value(text, "mealquest_jobs", kind="succeed", status="queued") == 1
    assert value(text, "mealquest_job_oldest_due_age_seconds", kind="succeed") >= 0


def test_the_runner_counts_each_outcome_and_times_each_run(client, jobs, household, operator):
    before = scrape(client, operator)
    household_id = household.household_id
    ids = [
        jobs.enqueue("succeed", {"value": 1}, household_id=household_id),
        jobs.enqueue("fail_with_failure", {"message": "no"}, household_id=household_id),
        jobs.enqueue("flaky", {"fail_times": 1}, household_id=household_id),
    ]
    jobs.start_pool()
    wait_for(lambda: all(jobs.get(i).status in (Status.SUCCEEDED, Status.FAILED) for i in ids))
    runs = "mealquest_job_runs_total"
    # Counted once the outcome is stored, a moment after other readers see it.
    after = wait_for(
        lambda: (
            (text := scrape(client, operator))
            and value(text, runs, kind="flaky", outcome="succeeded")
            > value(before, runs, kind="flaky", outcome="succeeded")
            and text
        )
    )

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(runs, kind="succeed", outcome="succeeded") == 1
    assert delta(runs, kind="fail_with_failure", outcome="failed") == 1
    assert delta(runs, kind="flaky", outcome="retried") == 1
    assert delta(runs, kind="flaky", outcome="succeeded") == 1
    duration = "mealquest_job_run_duration_seconds_count"
    assert delta(duration, kind="succeed") == 1
    assert delta(duration, kind="flaky") == 2
    # Each start waited, the retry's too.
    waits = "mealquest_job_wait_seconds_count"
    assert delta(waits, kind="succeed") == 1
    assert delta(waits, kind="flaky") == 2


def test_a_jobs_wait_counts_from_its_due_time_to_its_start(client, jobs, household, operator):
    before = scrape(client, operator)
    due = datetime.now(UTC) - timedelta(seconds=100)
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id, run_at=due)
    jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    after = wait_for(
        lambda: (
            (text := scrape(client, operator))
            and value(text, "mealquest_job_wait_seconds_count", kind="succeed")
            > value(before, "mealquest_job_wait_seconds_count", kind="succeed")
            and text
        )
    )

    def delta(le):
        name = "mealquest_job_wait_seconds_bucket"
        return value(after, name, kind="succeed", le=le) - value(
            before, name, kind="succeed", le=le
        )

    # It had been due for 100 s (and more, by the time it started).
    assert (delta("60.0"), delta("120.0")) == (0, 1)
    assert value(after, "mealquest_job_wait_seconds_sum", kind="succeed") >= 100


def test_the_runs_and_waits_kept_between_batches_are_bounded(client, jobs, household, operator):
    # A pool applies its attempts' metrics in batches; however long a batch
    # waits (a busy hub), no more than the bound are kept: the one past it
    # applies them all at once.
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    pool = jobs.start_pool()
    job = wait_for(lambda: (found := jobs.get(job_id)).status == Status.SUCCEEDED and found)
    pool.stop(timeout=1)
    waits = "mealquest_job_wait_seconds_count"
    runs = "mealquest_job_runs_total"
    before = scrape(client, operator)
    kept = AttemptMetrics(jobs.registry, kept_at_most=3)
    running = Running(job, Lease(job.id, "a claim", job.attempt), deadline=0.0, lease_deadline=0.0)

    def added(name, **labels):
        return value(scrape(client, operator), name, **labels) - value(before, name, **labels)

    kept.started(job)
    kept.started(job)
    assert added(waits, kind="succeed") == 0
    kept.started(job)
    assert added(waits, kind="succeed") == 3
    kept.attempt_recorded(running, Outcome(Status.SUCCEEDED))
    kept.attempt_recorded(running, Outcome(Status.SUCCEEDED))
    assert added(runs, kind="succeed", outcome="succeeded") == 0
    kept.attempt_recorded(running, Outcome(Status.SUCCEEDED))
    assert added(runs, kind="succeed", outcome="succeeded") == 3
    assert added("mealquest_job_run_duration_seconds_count", kind="succeed") == 3


def test_a_paused_kind_is_a_gauge_of_one_and_the_other_kinds_zero(
    app, client, jobs, household, operator
):
    from mealquest.jobs.service import flow
    from mealquest.metrics.view import cached_figures
    from mealquest.queue_stats import MAX_AGE_SECONDS

    jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    flow.pause(jobs.store, jobs.registry, "sleep", None)
    cached_figures(app).forget()

    text = scrape(client, operator)

    assert value(text, "mealquest_kind_paused", kind="sleep") == 1
    assert ("mealquest_kind_paused", frozenset({("kind", "succeed")})) in samples(text)
    assert value(text, "mealquest_kind_paused", kind="succeed") == 0
    # Read with the queue figures, at most once per interval: a resume shows by the next.
    flow.resume(jobs.store, "sleep", None)
    wait_for(
        lambda: value(scrape(client, operator), "mealquest_kind_paused", kind="sleep") == 0,
        timeout=10 * MAX_AGE_SECONDS + 30,
    )


def test_a_snooze_is_counted_as_its_own_outcome(client, jobs, household, operator):
    runs = "mealquest_job_runs_total"
    before = scrape(client, operator)
    job_id = jobs.enqueue(
        "snooze_then_succeed", {"seconds": 0.0, "times": 1}, household_id=household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    after = wait_for(
        lambda: (
            (text := scrape(client, operator))
            and value(text, runs, kind="snooze_then_succeed", outcome="succeeded")
            > value(before, runs, kind="snooze_then_succeed", outcome="succeeded")
            and text
        )
    )
    for outcome, counted in (("snoozed", 1), ("retried", 0), ("succeeded", 1)):
        delta = value(after, runs, kind="snooze_then_succeed", outcome=outcome) - value(
            before, runs, kind="snooze_then_succeed", outcome=outcome
        )
        assert delta == counted, outcome


def test_a_stop_counts_the_jobs_it_interrupts(client, jobs, household, operator, gates):
    before = scrape(client, operator)
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("held")}, household_id=household.household_id
    )
    pool = jobs.start_pool()
    wait_for(lambda: gates.arrivals("held") == 1)
    report = pool.stop(timeout=0)
    assert report.failed == (job_id,)
    after = scrape(client, operator)
    labels = {"kind": "wait_for_gate", "outcome": "interrupted"}
    assert (
        value(after, "mealquest_job_runs_total", **labels)
        - value(before, "mealquest_job_runs_total", **labels)
        == 1
    )


def test_a_rescue_counts_the_jobs_it_takes_back(client, store, jobs, household, operator):
    before = scrape(client, operator)
    job_id = jobs.enqueue("sleep", {"seconds": 0}, household_id=household.household_id)
    sql.execute(
        store,
        "UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'gone', "
        "lease_expires_at = created_at WHERE id = ?",
        (job_id,),
    )
    recovered = rescue_all(store)
    assert recovered.failed == (job_id,)
    after = scrape(client, operator)
    assert (
        value(after, "mealquest_job_rescues_total") - value(before, "mealquest_job_rescues_total")
        == 1
    )
    labels = {"kind": "sleep", "outcome": "interrupted"}
    assert (
        value(after, "mealquest_job_runs_total", **labels)
        - value(before, "mealquest_job_runs_total", **labels)
        == 1
    )


def test_routes_are_labelled_by_their_url_rule_never_the_raw_path(
    client, jobs, household, auth, operator
):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    before = scrape(client, operator)
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).status_code == 200
    assert client.get("/api/v1/jobs/unknown-id", headers=auth).status_code == 404
    assert client.get(f"/no/such/{job_id}").status_code == 404
    assert client.open("/healthz", method="BREW").status_code == 405
    after = scrape(client, operator)
    assert job_id not in after
    assert "unknown-id" not in after

    def delta(**labels):
        name = "mealquest_http_requests_total"
        return value(after, name, **labels) - value(before, name, **labels)

    rule = "/api/v1/jobs/<job_id>"
    assert delta(route=rule, method="GET", status="200") == 1
    assert delta(route=rule, method="GET", status="404") == 1
    assert delta(route="unmatched", method="GET", status="404") == 1
    assert delta(route="unmatched", method="other", status="405") == 1
    assert value(after, "mealquest_http_request_duration_seconds_count", route=rule) >= 2


def test_queue_figures_are_read_once_per_interval_and_never_waited_for_again(
    store, jobs, household
):
    now = [0.0]
    cached = CachedFigures(store, max_age=1.5, clock=lambda: now[0])
    assert cached.get().counts == {}  # the first read is waited for
    jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    now[0] = 1.0
    assert cached.get().counts == {}  # fresh enough: no read
    gevent.sleep(0.05)
    assert cached.get().counts == {}
    now[0] = 1.6
    # Stale: answered at once while one greenlet reads again.
    assert cached.get().counts == {}
    assert wait_for(lambda: cached.get().counts) == {("succeed", "queued"): 1}


def test_flask_jobs_work_serves_metrics_on_its_own_port_for_operators_only(
    store, household, operator
):
    server = standalone.serve(store, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}"

        def get(path, headers):
            # In a native thread: the server answers from this process's event loop.
            return gevent.get_hub().threadpool.apply(
                requests.get, (url + path,), {"headers": headers, "timeout": 10}
            )

        served = get("/metrics", bearer(operator.token))
        assert served.status_code == 200
        assert "mealquest_jobs" in served.text
        for headers in ({}, bearer(household.token), bearer("mqop_nope")):
            refused = get("/metrics", headers)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"
        assert get("/other", bearer(operator.token)).status_code == 404
    finally:
        server.stop()


def test_the_metrics_port_is_off_unless_set(make_app):
    app = make_app()
    assert app.config["METRICS_PORT"] is None
    assert standalone.serve_configured(app) is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"DASHBOARD": True},
            "MEALQUEST_SECRET_KEY: must be set (32 characters or more) "
            "when MEALQUEST_DASHBOARD is on",
        ),
        (
            {"DASHBOARD": True, "SECRET_KEY": "short-secret"},
            "MEALQUEST_SECRET_KEY: must be a text of 32 characters or more",
        ),
        ({"METRICS_PORT": 70000}, "MEALQUEST_METRICS_PORT: must be a port number, 1 to 65535"),
        ({"METRICS_PORT": 0}, "MEALQUEST_METRICS_PORT: must be a whole number, 1 or more (got 0)"),
    ],
)
def test_dashboard_and_metrics_settings_are_checked_in_one_line(database, config, message):
    from mealquest.application import create_app

    with pytest.raises(ConfigError) as raised:
        create_app({"TESTING": True, **database, **config})
    assert str(raised.value).startswith(message)
    assert "short-secret" not in str(raised.value)
