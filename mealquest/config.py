"""Configuration defaults; every key is documented in the README.

`create_app` reads these, then `MEALQUEST_*` environment variables (Flask's
`from_prefixed_env`, which parses values as JSON: `MEALQUEST_JOB_WORKERS=8`
is the number 8), then the mapping a test passes, and checks the result
(`mealquest.config_check`, which has a rule for every key here).
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # The database: `sqlite:///relative/path`, `sqlite:////absolute/path` or
    # `postgresql://user:password@host:port/db`; None uses the SQLite file DATABASE.
    "DATABASE_URL": None,
    # SQLite file; None means `mealquest.sqlite3` in the instance folder.
    "DATABASE": None,
    # PostgreSQL: connections each process's pool may open (plus one listener).
    "PG_POOL_SIZE": 10,
    # PostgreSQL: wake idle pools with LISTEN/NOTIFY (polling always runs); off
    # behind PgBouncer in transaction mode, which cannot hold a LISTEN.
    "PG_LISTEN": True,
    # PRAGMA synchronous for every connection: NORMAL (WAL: an OS crash or power
    # loss may lose the last commits, never corrupt) or FULL (every commit durable).
    "DB_SYNCHRONOUS": "NORMAL",
    # How long a read or write may wait for SQLite locks before the caller gets
    # StoreUnavailable (503 over HTTP).
    "DB_BUSY_TIMEOUT_SECONDS": 5.0,
    # Concurrent jobs per process.
    "JOB_WORKERS": 4,
    # Idle workers look for due jobs at least this often (jobs enqueued by this
    # process wake them at once; retries whose run-at comes are found this way).
    "JOB_POLL_SECONDS": 1.0,
    # How often an idle pool checks `PRAGMA data_version` to notice jobs
    # enqueued by other processes without waiting for the poll.
    "JOB_CHANGE_CHECK_SECONDS": 0.005,
    # A running job's lease; a process renews the leases of its jobs every
    # JOB_HEARTBEAT_SECONDS, and a lease not renewed in time is rescued. Keep
    # it above gunicorn's `timeout` plus a heartbeat: a worker whose event
    # loop is blocked is then killed before its jobs' leases can expire, so no
    # job runs twice at once.
    "JOB_LEASE_SECONDS": 60.0,
    # None: a third of the lease. Set, it must be below the lease.
    "JOB_HEARTBEAT_SECONDS": None,
    # How often each process rescues jobs whose lease expired; None: half the lease.
    "JOB_RESCUE_SECONDS": None,
    # How long a handler stopped by its timeout, a stop or a lost lease has to
    # die before the pool gives up on it: the job is recorded without it and
    # the process restarts gracefully (the only way to end such a greenlet).
    "JOB_KILL_GRACE_SECONDS": 5.0,
    # How often each pool logs how many queued jobs wait for kinds it has no
    # handler for (left queued for processes that know them).
    "JOB_UNHANDLED_REPORT_SECONDS": 60.0,
    # A handler holding the event loop longer than this is named at ERROR with
    # its job id and kind by gevent's hub monitor (0 turns the monitor off).
    "JOB_MAX_BLOCKING_SECONDS": 1.0,
    # A household's quota: jobs it may have queued or running at once; an
    # enqueue past it is refused (HTTP 429 `too_many_jobs`, with Retry-After).
    "JOB_MAX_PENDING_PER_HOUSEHOLD": 100,
    # How long a stopping pool lets running jobs finish before it stops them.
    "JOB_STOP_TIMEOUT_SECONDS": 25.0,
    # How old a periodic kind's scheduled time (cron, UTC) may be and still
    # make its one job when a scheduler looks after it: processes down across
    # a slot for less than this make it when they are back (one job for all
    # the slots missed); older slots are skipped.
    "JOB_CRON_CATCHUP_SECONDS": 3600.0,
    # Finished jobs (every final status) older than this many days are
    # deleted by the hourly `prune_jobs` maintenance job; 0 keeps them all.
    # Recipes stay.
    "JOB_RETENTION_DAYS": 14,
    # Whether each gunicorn web worker runs a job pool (True), or serves HTTP
    # only (False) for deployments that run `flask jobs work` processes.
    "JOB_POOL_IN_WEB": True,
    # How many proxies in front of the app to trust for X-Forwarded-For, -Proto,
    # -Host and -Port (werkzeug's ProxyFix). 0: none, the app faces clients; 1:
    # behind one nginx. More than the real number lets clients spoof their address.
    "PROXY_FIX_HOPS": 0,
    # Flask: the largest request body accepted (413 above it). nginx's
    # client_max_body_size in deploy/nginx.conf matches it.
    "MAX_CONTENT_LENGTH": 64 * 1024,
    # The longest path plus query string accepted (414 `uri_too_long` above
    # it); below gunicorn's limit_request_line and nginx's header buffers so
    # that the app, not the server, answers.
    "MAX_URI_LENGTH": 4000,
    # The operators' dashboard at /admin/ (sign-in with an operator token);
    # off by default. On, SECRET_KEY must be set: it signs the session cookie.
    "DASHBOARD": False,
    # Flask's key for signing the dashboard's session cookie and CSRF tokens:
    # 32 characters or more, random, the same on every worker and host.
    "SECRET_KEY": None,
    # A dashboard sign-in lasts this many hours, then the operator signs in again.
    "DASHBOARD_SESSION_HOURS": 12.0,
    # `flask jobs work` serves GET /metrics on this port (None: not at all;
    # under gunicorn the app's own /metrics route serves every worker's figures).
    "METRICS_PORT": None,
    # The address that port is bound to.
    "METRICS_HOST": "127.0.0.1",
    # Level of the service's own log lines (stderr).
    "LOG_LEVEL": "INFO",
    # Recipe import: let fetches reach private, loopback, link-local, multicast
    # and reserved addresses (development and tests only: it exposes the
    # service's own network, cloud metadata endpoints included, to households).
    "ALLOW_PRIVATE_URLS": False,
    # Recipe import: private networks (CIDR strings) a fetch may reach even with
    # ALLOW_PRIVATE_URLS off, e.g. ["10.1.2.0/24"] for an internal recipe host.
    "RECIPE_FETCH_ALLOWED_NETWORKS": [],
    # Recipe import: seconds to open a TCP connection to one address.
    "RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS": 5.0,
    # Recipe import: seconds for the whole fetch (DNS, every redirect, the body).
    "RECIPE_FETCH_TIMEOUT_SECONDS": 20.0,
    # Recipe import: the largest page read, in bytes; a larger one fails the job.
    "RECIPE_FETCH_MAX_BYTES": 4 * 1024 * 1024,
    # Recipe import: redirects followed before the job fails.
    "RECIPE_FETCH_MAX_REDIRECTS": 5,
    # Recipe import: seconds a page's parse may take, on the wall clock and of
    # CPU, in its parser process, which is killed then (the job fails "the
    # page could not be read"). Real pages of 1.2 MB parse in 0.3 s of CPU.
    "RECIPE_PARSE_SECONDS": 10.0,
    # Recipe import: seconds before the first retry of a transient failure
    # (doubled for the next; 3 attempts in all).
    "RECIPE_IMPORT_RETRY_SECONDS": 5.0,
}
