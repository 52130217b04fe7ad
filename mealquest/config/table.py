"""Every `MEALQUEST_*` setting, once: its default, the rule its value keeps, and its doc.

The docs' settings reference is this table (`python -m mealquest.config`
prints it; the docs build renders it); `create_app` starts from
these defaults and checks every value by its rule; the pool's settings take
their defaults from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mealquest.config import rules
from mealquest.db.options import POOLERS, SYNCHRONOUS_MODES

ENV_PREFIX = "MEALQUEST_"
# Without an explicit value, a process renews its leases three times per
# lease and rescues expired ones twice per lease.
HEARTBEATS_PER_LEASE = 3
RESCUES_PER_LEASE = 2
# The job pool's connections for its handlers' own writes (partial results):
# short transactions that take turns on a few connections, so that a pool of
# many workers does not open as many connections to the server.
HANDLER_CONNECTIONS = 4
# Without an explicit value, a `flask jobs work` process exits once its event
# loop has been blocked ten times as long as the hub monitor lets a handler
# hold it before naming it.
BLOCKED_EXIT_PER_MAX_BLOCKING = 10


# `MEALQUEST_*` variables that are no setting of the app, read elsewhere:
# gunicorn's configuration (`gunicorn.conf.py`) reads these two...
OTHER_VARIABLES = frozenset({"MEALQUEST_BIND", "MEALQUEST_METRICS_DIR_PARENT"})
# ...and the test suite and the bench read their own.
OTHER_PREFIXES = ("MEALQUEST_TEST_", "MEALQUEST_BENCH_")


@dataclass(frozen=True)
class Setting:
    """One setting: `key` without its `MEALQUEST_` prefix; `shown` is how the
    docs state the default when the value alone would not say it."""

    key: str
    default: Any
    rule: Callable[[Any], Any]
    doc: str
    shown: str | None = None

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.key


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "DATABASE_URL",
        None,
        rules.database_url,
        "the database: `sqlite:///relative/path`, `sqlite:////absolute/path` or "
        "`postgresql://user:password@host:port/db` (`postgres://` too); unset, the SQLite "
        "file `MEALQUEST_DATABASE`. See [PostgreSQL](../operations/postgresql.md)",
    ),
    Setting(
        "DATABASE",
        None,
        rules.file_path,
        "the SQLite file, when no URL is set",
        shown="`instance/mealquest.sqlite3`",
    ),
    Setting(
        "PG_POOL_SIZE",
        10,
        rules.whole(1),
        "PostgreSQL: connections each process may open for HTTP requests and commands "
        "(its job pool has its own: `MEALQUEST_PG_RUNNER_POOL_SIZE`, plus one for LISTEN)",
    ),
    Setting(
        "PG_RUNNER_POOL_SIZE",
        None,
        rules.derived(rules.whole(1)),
        "PostgreSQL: connections each process's job pool has of its own, apart from "
        "those of `MEALQUEST_PG_POOL_SIZE`, which HTTP requests share: a flood of requests "
        "cannot take them from the heartbeats, claims and outcomes",
        shown="the smaller of `MEALQUEST_JOB_WORKERS` and 4, plus 3 (`7`)",
    ),
    Setting(
        "PG_LISTEN",
        None,
        rules.derived(rules.flag),
        "PostgreSQL: wake idle pools with LISTEN/NOTIFY; `false` polls only. `true` with "
        "`MEALQUEST_PG_POOLER=transaction` is refused (one line): such a pooler cannot hold "
        "a LISTEN",
        shown="on, off with `MEALQUEST_PG_POOLER=transaction`",
    ),
    Setting(
        "PG_POOLER",
        "none",
        rules.lower_one_of(*POOLERS),
        "PostgreSQL: what stands between the service and the server. `none`: the server "
        "itself (or a pooler in session mode); `transaction`: a pooler that gives out a "
        "server connection per transaction (PgBouncer's `pool_mode = transaction`): no "
        "prepared statements, no LISTEN, the settings made in each transaction. See "
        "[Through PgBouncer](../operations/postgresql.md#through-pgbouncer-in-transaction-mode)",
    ),
    Setting(
        "PG_DEAD_SOCKET_SECONDS",
        15,
        rules.whole(3),
        "PostgreSQL: a connection whose server vanished without closing it (a host down, "
        "a network cut, a failover) is found dead within this many seconds, by TCP "
        "keepalives while it waits and `tcp_user_timeout` while it sends, and replaced. See "
        "[Failover](../operations/failover.md)",
    ),
    Setting(
        "DB_SYNCHRONOUS",
        "NORMAL",
        rules.one_of(*SYNCHRONOUS_MODES),
        "`PRAGMA synchronous`. With WAL, `NORMAL` never corrupts the file, and an "
        "application crash loses nothing, but an OS crash or power cut may lose the last "
        "commits (a job finished just before may run again); `FULL` makes every commit "
        "durable at the cost of an fsync per write",
    ),
    Setting(
        "DB_BUSY_TIMEOUT_SECONDS",
        5.0,
        rules.positive,
        "how long a read or write waits for SQLite locks before the caller gets `503 unavailable`",
    ),
    Setting(
        "JOB_WORKERS",
        32,
        rules.whole(1),
        "jobs run at once per process (greenlets, cheap while they wait on the network; "
        "claims and outcomes are batched up to this many per transaction)",
    ),
    Setting(
        "JOB_POLL_SECONDS",
        1.0,
        rules.positive,
        "an idle pool claims at least this often (finds retries whose time has come)",
    ),
    Setting(
        "JOB_CHANGE_CHECK_SECONDS",
        0.005,
        rules.positive,
        "how often an idle pool checks `PRAGMA data_version` to see other processes' enqueues",
    ),
    Setting(
        "JOB_LEASE_SECONDS",
        60.0,
        rules.positive,
        "a running job's lease; a job whose process stops renewing it is rescued after "
        "this. It must exceed `MEALQUEST_JOB_BLOCKED_EXIT_SECONDS` plus a heartbeat, and "
        "under gunicorn its `timeout` plus a heartbeat (refused otherwise), so that a "
        "process whose event loop is blocked is gone before its jobs' leases can expire",
    ),
    Setting(
        "JOB_HEARTBEAT_SECONDS",
        None,
        rules.derived(rules.positive),
        "how often a process renews its jobs' leases; if set, it must be below the lease",
        shown="a third of the lease (`20.0`)",
    ),
    Setting(
        "JOB_RESCUE_SECONDS",
        None,
        rules.derived(rules.positive),
        "how often each process rescues jobs with expired leases",
        shown="half the lease (`30.0`)",
    ),
    Setting(
        "JOB_KILL_GRACE_SECONDS",
        5.0,
        rules.positive,
        "how long a handler stopped by its timeout, a stop or a lost lease has to die "
        "before the pool gives up on it (records its job, keeps its slot, restarts the "
        "process); also how long the handler of a cancelled running job has to stop by "
        "itself (`ctx.cancelled`) before it is killed",
    ),
    Setting(
        "JOB_UNHANDLED_REPORT_SECONDS",
        60.0,
        rules.positive,
        "how often each pool logs the queued jobs of kinds it has no handler for",
    ),
    Setting(
        "JOB_MAX_BLOCKING_SECONDS",
        1.0,
        rules.not_negative,
        "a handler that holds the event loop longer is named at ERROR with its job id and "
        "kind (gevent's hub monitor); `0` turns the monitor off",
    ),
    Setting(
        "JOB_BLOCKED_EXIT_SECONDS",
        None,
        rules.derived(rules.positive),
        "a `flask jobs work` process whose event loop stays blocked this long exits at once "
        "(status 1, one line on stderr), as gunicorn kills such a worker after its `timeout`, "
        "so that its jobs' leases cannot expire while it lives. `MEALQUEST_JOB_LEASE_SECONDS` "
        "must exceed it plus a heartbeat (and, under gunicorn, gunicorn's `timeout` plus a "
        "heartbeat); a start that breaks either is refused with one line. See [What a handler "
        "must not do](../guides/job-api.md#what-a-handler-must-not-do)",
        shown="ten times `MEALQUEST_JOB_MAX_BLOCKING_SECONDS` (`10.0`; ten times its "
        "default when that is `0`)",
    ),
    Setting(
        "JOB_MAX_PENDING_PER_HOUSEHOLD",
        100,
        rules.whole(1),
        "a household's quota: jobs it may have queued or running at once; an enqueue past "
        "it is refused (`429 too_many_jobs`). See "
        "[Fair shares](../architecture/fair-shares.md)",
    ),
    Setting(
        "JOB_MAX_SNOOZES",
        50,
        rules.whole(0),
        "how many times a job may be snoozed (a handler's `Snooze`, which spends no "
        "attempt); the next snooze fails it `snoozed too often`. See "
        "[Flow control](../guides/flow-control.md)",
    ),
    Setting(
        "STREAM_MAX_SECONDS",
        300.0,
        rules.positive,
        "a job's event stream (`GET /api/v1/jobs/{id}/events`) ends after this long; the "
        "client reconnects with `Last-Event-ID`. See [Waiting for a job](../guides/waiting.md)",
    ),
    Setting(
        "STREAM_MAX_PER_HOUSEHOLD",
        20,
        rules.whole(1),
        "held requests (event streams and long polls together) a household may have open "
        "at once, across every process and host; one more stream is `429 too_many_streams` "
        "with `Retry-After`, one more long poll answers at once as without `wait`",
    ),
    Setting(
        "WAIT_MAX_PER_PROCESS",
        None,
        rules.derived(rules.whole(1)),
        "held requests (event streams and long polls of every household) one process holds "
        "at once; one more stream is `503 unavailable` with `Retry-After`, one more long "
        "poll answers at once as without `wait`: held requests never take the connections "
        "other requests need",
        shown="half of gunicorn's `worker_connections` (`500`)",
    ),
    Setting(
        "STREAM_SEND_TIMEOUT_SECONDS",
        10.0,
        rules.positive,
        "an event stream whose client has not taken what was sent after this long is "
        "dropped: a reader that stops reading holds no greenlet, memory or restart",
    ),
    Setting(
        "STREAM_HEARTBEAT_SECONDS",
        15.0,
        rules.positive_at_most(15),
        "how often an open event stream sends a comment line when nothing else happened "
        "(keeps proxies from timing it out: nginx's `proxy_read_timeout` in "
        "`deploy/nginx.conf` is longer); a stream's token (revoked, its household suspended or "
        "erased) is checked every `MEALQUEST_JOB_POLL_SECONDS`",
    ),
    Setting(
        "JOB_STOP_TIMEOUT_SECONDS",
        25.0,
        rules.not_negative,
        "how long `flask jobs work` lets running jobs finish when stopped (under gunicorn, "
        "`graceful_timeout` minus a second)",
    ),
    Setting(
        "MAX_CONTENT_LENGTH",
        64 * 1024,
        rules.whole(1),
        "largest request body in bytes (`413` above it); nginx's `client_max_body_size` "
        "in `deploy/nginx.conf` matches it",
    ),
    Setting(
        "MAX_URI_LENGTH",
        4000,
        rules.whole(1),
        "longest path plus query string in bytes (`414 uri_too_long` above it); below "
        "gunicorn's `limit_request_line` (8190) and nginx's header buffers (8 KiB), which "
        "answer longer ones (nginx in the same envelope)",
    ),
    Setting(
        "LOG_LEVEL",
        "INFO",
        rules.one_of(*rules.LOG_LEVELS),
        "level of the service's own log lines (stderr)",
    ),
    Setting(
        "LOG_FORMAT",
        "text",
        rules.lower_one_of("text", "json"),
        "`text`: one readable line per record; `json`: one JSON object per line (`time`, "
        "`level`, `logger`, `message`, `pid`, and `job_id`, `kind`, `attempt`, `request_id`, "
        "`trace_id` where known), for the service's lines and gunicorn's (its access log too). See "
        "[Monitoring](../operations/monitoring.md#json-logs)",
    ),
    Setting(
        "TRACING",
        False,
        rules.flag,
        "OpenTelemetry traces of requests and of each job's attempts, exported by OTLP "
        "over HTTP; also on whenever `OTEL_EXPORTER_OTLP_ENDPOINT` is set. See "
        "[Tracing](../operations/tracing.md)",
    ),
    Setting(
        "TRACING_TRUST_INCOMING",
        False,
        rules.flag,
        "continue the trace a request's `traceparent` header names (its trace id and its "
        "sampled flag). Off, a request starts a trace of its own, sampled by the "
        "service's sampler, with a link to the client's: a client chooses neither the trace "
        "its jobs are in nor what is sampled. On only behind a proxy that sets the header "
        "itself. See [Tracing](../operations/tracing.md)",
    ),
    Setting(
        "JOB_CRON_CATCHUP_SECONDS",
        3600.0,
        rules.positive,
        "how old a periodic kind's scheduled time may be and still make its job when a "
        "scheduler looks after it: if every process was down across a slot for less than "
        "this, the slot's job is made when one is back (one job for all the slots missed, "
        "the latest); older slots are skipped. See [Periodic jobs](../guides/periodic-jobs.md)",
    ),
    Setting(
        "JOB_RETENTION_DAYS",
        14,
        rules.whole(0),
        "finished jobs (every final status) older than this many whole days are deleted by "
        "the hourly `prune_jobs` maintenance job; `0` keeps them all. Recipes stay. See "
        "[Retention](../operations/administration.md#retention)",
    ),
    Setting(
        "DASHBOARD",
        False,
        rules.flag,
        "serve the operators' dashboard at `/admin/` (see "
        "[Operators](../operations/dashboard.md)); on, `MEALQUEST_SECRET_KEY` is "
        "required",
    ),
    Setting(
        "SECRET_KEY",
        None,
        rules.secret_key,
        "signs the dashboard's session cookie and CSRF tokens: 32 characters or more, "
        "random (`python3 -c 'import secrets; print(secrets.token_urlsafe(48))'`), the same "
        "on every worker and host; never shown in an error",
    ),
    Setting(
        "DASHBOARD_SESSION_HOURS",
        12.0,
        rules.positive,
        "a dashboard sign-in lasts this long",
        shown="`12`",
    ),
    Setting(
        "METRICS_PORT",
        None,
        rules.derived(rules.whole(1)),
        "`flask jobs work` serves `GET /metrics` on this port; unset, it serves no metrics "
        "at all (under gunicorn, the app's own `/metrics` route serves them)",
    ),
    Setting(
        "METRICS_HOST",
        "127.0.0.1",
        rules.text,
        "the address that port is bound to",
    ),
    Setting(
        "JOB_POOL_IN_WEB",
        True,
        rules.flag,
        "each gunicorn worker runs a job pool; `false` for web-only workers when "
        "`flask jobs work` processes run the jobs (see Deployment)",
    ),
    Setting(
        "PROXY_FIX_HOPS",
        0,
        rules.whole(0),
        "proxies in front of the app whose `X-Forwarded-For`/`-Proto`/`-Host`/`-Port` are "
        "trusted (werkzeug's `ProxyFix`); `1` behind the nginx of `deploy/nginx.conf`. "
        "Never more than there are: a client could then choose its own address",
    ),
    Setting(
        "ALLOW_PRIVATE_URLS",
        False,
        rules.flag,
        "let recipe imports fetch private, loopback, link-local (cloud metadata), "
        "multicast, reserved and unspecified addresses. **Development and tests only**: "
        "on, any household can make the service read its own network",
    ),
    Setting(
        "RECIPE_FETCH_ALLOWED_NETWORKS",
        [],
        rules.networks,
        "private networks a recipe import may reach while the above is off, as a JSON "
        "list of CIDRs, e.g. `'[\"10.1.2.0/24\"]'`",
    ),
    Setting(
        "RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS",
        5.0,
        rules.positive,
        "time to open a TCP connection to one address of the page's host",
    ),
    Setting(
        "RECIPE_FETCH_TIMEOUT_SECONDS",
        20.0,
        rules.positive,
        "time for a whole fetch: name resolution, every redirect and the body",
    ),
    Setting(
        "RECIPE_FETCH_MAX_BYTES",
        4 * 1024 * 1024,
        rules.whole(1),
        "largest page read (4 MiB); the body is streamed and abandoned past it",
    ),
    Setting(
        "RECIPE_FETCH_MAX_REDIRECTS",
        5,
        rules.whole(0),
        "redirects followed before the import fails",
    ),
    Setting(
        "RECIPE_PARSE_SECONDS",
        10.0,
        rules.positive,
        "time a page's parse may take, on the wall clock and of CPU (whole seconds there, "
        "rounded up), in its parser process, which is killed then: the import fails `the "
        "page could not be read`. Real recipe pages of 1.2 MB parse in 0.3 s of CPU. See "
        "[Recipe import](../guides/recipe-import.md)",
    ),
    Setting(
        "RECIPE_IMPORTS_PER_PROCESS",
        4,
        rules.whole(1),
        "recipe imports that run at once in each process, each with a warm parser "
        "process (about 50 MB) of its own; the others wait queued while other kinds run",
    ),
    Setting(
        "SHOPPING_LIST_SECONDS",
        60.0,
        rules.positive,
        "time a shopping list's reading of its ingredient lines may take, on the wall clock "
        "and of CPU, in a parser process, which is killed then: the list fails `the "
        "shopping list took too long to make`. A list of 2,000 real lines reads in about 4 s "
        "of CPU",
    ),
    Setting(
        "SHOPPING_LIST_CONFIRM_SECONDS",
        86_400.0,
        rules.positive,
        'how long a shopping list asked for with `"confirm": true` waits for the '
        "household's confirmation (signal `confirm`); then it ends with the list as merged, "
        '`"confirmed": false`. It holds no slot while it waits',
    ),
    Setting(
        "SHOPPING_LISTS_PER_PROCESS",
        2,
        rules.whole(1),
        "shopping lists that run at once in each process, each reading its lines in a "
        "parser process of its own; the others wait queued while other kinds run",
    ),
    Setting(
        "RECIPE_IMPORT_RETRY_SECONDS",
        5.0,
        rules.positive,
        "delay before retrying a transient fetch failure, doubled for the third and last "
        "attempt (±10 %)",
    ),
    Setting(
        "RECIPE_FETCH_MAX_PER_HOST",
        2,
        rules.whole(0),
        "recipe imports of one host (the URL's, lower case, `www.` left out) that run at "
        "once in the whole deployment; `0`: no limit. See "
        "[Flow control](../guides/flow-control.md)",
    ),
    Setting(
        "RECIPE_FETCH_PER_HOST_PER_MINUTE",
        30,
        rules.whole(0),
        "recipe imports of one host that may start in any minute, in the whole "
        "deployment; `0`: no limit",
    ),
)

DEFAULTS: dict[str, Any] = {setting.key: setting.default for setting in SETTINGS}


def _shown(setting: Setting) -> str:
    if setting.shown is not None:
        return setting.shown
    value = setting.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return f"`{value!r}`"
    return f"`{value}`"


def markdown_table() -> str:
    """The settings reference's table, row for row (links relative to that page)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{s.variable}` | {_shown(s)} | {s.doc} |" for s in SETTINGS]
    return "\n".join(lines) + "\n"
