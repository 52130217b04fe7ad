"""The PostgreSQL driver's store: the contract's `Store` over a pool of psycopg connections.

* `write(fn, ...)` runs `fn(tx, ...)` as one transaction on a connection of
  its own from the pool; `read(fn, ...)` runs `fn(conn, ...)` on one too
  (autocommit: each statement sees the latest commits). A connection is
  never used by two greenlets at once.
* Every wait has the store's deadline: the pool's wait for a connection,
  the connect (`connect_timeout`), each statement (`statement_timeout`, so
  the server cancels a slow one and the connection stays usable), and a
  backstop timer for a server that stopped answering at all (the
  connection is then closed, its state being unknown). A server that is
  down, restarting or too slow is `StoreUnavailable`, never a hung worker.
* The pool is opened lazily, by the first call in the process that makes
  it, and refuses use after a `fork`, as the SQLite store does.
* psycopg is imported only then, not with this module: it fixes at import
  whether its waits yield to gevent (see `waiting`).
* Behind a pooler in transaction mode (PgBouncer's `pool_mode = transaction`,
  `pooler="transaction"`), a client connection meets another server
  connection at every transaction, so nothing may outlive one: no
  prepared statements (psycopg prepares a statement after its fifth run on
  a connection; the next transaction's server connection may not have it,
  or may have another client's under the same name), no LISTEN, and the
  settings are made per transaction (`SET LOCAL`), reads included: each
  read runs in a transaction of its own, which costs two round trips more
  than an autocommit statement.

Error texts of the driver quote the host and sometimes the statement, so
none reaches a `StoreUnavailable` or a log line below ERROR (`driver_logs`);
the URL and its password never appear in an error or a log line.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Collection, Hashable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

import gevent
from gevent import monkey

from mealquest.db.driver import (
    AuditStatements,
    BatchStatements,
    FlowStatements,
    HistoryStatements,
    HouseholdStatements,
    JobStatements,
    OperationStatements,
    OperatorStatements,
    PeriodicStatements,
    ProcessStatements,
    Reads,
    RecipeStatements,
    RetentionStatements,
    SessionStatements,
    SignalStatements,
    StreamStatements,
    Transaction,
)
from mealquest.db.errors import (
    StoreError,
    StoreUnavailable,
    StoreUsedAcrossFork,
    WriteOutcomeUnknown,
)
from mealquest.db.migrations import AppliedMigration, Ledger, Migration
from mealquest.db.options import POOLERS
from mealquest.db.postgresql import (
    audit,
    batches,
    flow,
    history,
    households,
    jobs,
    migrate,
    operations,
    operators,
    periodic,
    processes,
    recipes,
    retention,
    sessions,
    signals,
    streams,
)
from mealquest.db.postgresql.driver_logs import quiet_driver_logs
from mealquest.db.postgresql.notify import Listener, Notifier
from mealquest.db.postgresql.transaction import PostgresTransaction
from mealquest.db.postgresql.waiting import require_cooperative_psycopg

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

SCHEMES = ("postgresql", "postgres")
# How long past its deadline a call may wait on a server that answers nothing
# before the connection is given up: the server's own statement_timeout
# normally ends a slow statement first, leaving the connection usable.
_BACKSTOP_GRACE_SECONDS = 1.0
# With LISTEN off, how often `data_version` changes (each change costs the
# caller one look for a due job).
_POLL_ONLY_VERSION_SECONDS = 0.1
# How long a closing store waits to send its stopping listener's wake-up.
_WAKE_SECONDS = 0.5
# SQLSTATE classes that mean the database, not the statement, failed:
# connection (08), resources such as a full disk (53), operator intervention
# such as a shutdown or a cancelled statement (57), and a serialization
# failure or deadlock (40): the transaction may succeed if tried again.
_UNAVAILABLE_CLASSES = ("08", "40", "53", "57", "58")
# A standby after a failover: writes are refused until the new primary is reached.
_READ_ONLY_TRANSACTION = "25006"


def is_postgres_url(url: str) -> bool:
    return urlsplit(url).scheme in SCHEMES


def dead_socket_options(seconds: int) -> dict[str, int]:
    """libpq's TCP options under which a server that vanished without closing
    the connection is found dead within `seconds`: keepalive probes after a
    third of it idle, then probes enough to fill the rest (an idle connection
    and one waiting for an answer), and `tcp_user_timeout` for data sent and
    never acknowledged (a connection in the middle of sending)."""
    idle = max(1, seconds // 3)
    interval = max(1, (seconds - idle) // 5)
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": max(1, (seconds - idle) // interval),
        "tcp_user_timeout": seconds * 1000,
    }


def _with_port(host: str) -> str:
    """`host` or `host:port` (a bracketed IPv6 address too) with its port said."""
    if host.endswith("]") or ":" not in host.rpartition("]")[2]:
        return f"{host or 'localhost'}:5432"
    return host


class PostgresStore:
    """One process's access to a PostgreSQL database: a lazily opened pool."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_seconds: float = 5.0,
        pool_size: int = 10,
        listen: bool = True,
        pooler: str = "none",
        runner_pool_size: int | None = None,
        dead_socket_seconds: int = 15,
    ) -> None:
        if not is_postgres_url(url):
            raise StoreError("not a postgresql:// URL")
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if busy_timeout_seconds <= 0:
            raise ValueError("busy_timeout_seconds must be positive")
        if dead_socket_seconds < 3:
            raise ValueError("dead_socket_seconds must be at least 3")
        if pooler not in POOLERS:
            raise ValueError(f"pooler must be one of {', '.join(POOLERS)}")
        if pooler == "transaction" and listen:
            raise ValueError("a transaction pooler cannot hold a LISTEN: listen must be off")
        self.url = url
        self.busy_timeout_seconds = float(busy_timeout_seconds)
        self.pool_size = int(pool_size)
        # Connections of the job pool's own store (`for_runner`).
        self.runner_pool_size = int(runner_pool_size or pool_size)
        self.listen = listen
        self.pooler = pooler
        self.dead_socket_seconds = int(dead_socket_seconds)
        busy_ms = max(1, int(self.busy_timeout_seconds * 1000))
        # Each transaction's first statement; with a transaction pooler it also
        # makes the settings, for that transaction only (one round trip: the
        # simple protocol takes several statements at once).
        self._begin = (
            "BEGIN"
            if pooler == "none"
            else f"BEGIN; SET LOCAL statement_timeout = '{busy_ms}ms'; SET LOCAL TimeZone = 'UTC'; "
            "SET LOCAL DateStyle = 'ISO'"
        )
        self.notifier = Notifier(self.write)
        quiet_driver_logs()
        self._pid = os.getpid()
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] | None = None
        # Whether psycopg's waits yield to gevent here (set when the pool opens).
        self._cooperative = False
        self._listener: Listener | None = None
        self._runner: PostgresStore | None = None

    def __repr__(self) -> str:
        # Never the URL: it holds the password.
        return (
            f"<PostgresStore pool_size={self.pool_size} listen={self.listen} pooler={self.pooler}>"
        )

    # -- the driver's SQL, migrations and description -----------------------------

    name = "postgresql"
    migrations_dir = migrate.MIGRATIONS_DIR
    jobs: JobStatements = jobs
    batches: BatchStatements = batches
    households: HouseholdStatements = households
    recipes: RecipeStatements = recipes
    periodic: PeriodicStatements = periodic
    retention: RetentionStatements = retention
    operators: OperatorStatements = operators
    sessions: SessionStatements = sessions
    operations: OperationStatements = operations
    flow: FlowStatements = flow
    processes: ProcessStatements = processes
    streams: StreamStatements = streams
    signals: SignalStatements = signals
    audit: AuditStatements = audit
    history: HistoryStatements = history

    def describe(self) -> str:
        """The database as messages name it: each host with its port, and the
        name; never the password. A URL may name several hosts (a primary and
        its standbys, `host1:port1,host2:port2`), which urllib cannot parse."""
        parts = urlsplit(self.url)
        hosts = parts.netloc.rpartition("@")[2] or "localhost"
        return f"postgresql://{','.join(map(_with_port, hosts.split(',')))}{parts.path}"

    def exists(self) -> bool:
        """A server's database is there to ask; whether it answers is another matter."""
        return True

    def applied_migrations(self) -> dict[int, AppliedMigration]:
        return self.read(migrate.applied)

    def upgrade(self, target: int | None = None) -> list[Migration]:
        """Apply pending migrations (the foreground's job: it may wait on the lock)."""
        return migrate.upgrade(self.url, self.migrations_dir, target=target)

    def migration_status(self) -> Ledger:
        """The ledger as this code sees it."""
        return migrate.status(self.url, self.migrations_dir)

    @property
    def broken(self) -> bool:
        """Never: a connection that fails is replaced by the pool."""
        return False

    def check_writable(self) -> None:
        """Raise StoreUnavailable unless a write can commit now; cheap enough for /healthz."""
        self.write(lambda tx: tx.execute("SELECT 1"))

    def forget_deleted(self, timeout_seconds: float) -> bool:
        """Nothing the service can do: deleted rows stay as dead tuples until
        autovacuum reuses their space, and in the WAL, its archives and the
        backups for as long as they are kept (docs/operations/administration.md)."""
        return True

    # -- connections ------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg.connect's arguments for this store's connections (the pool's and
        the listener's): the deadline's connect timeout and TCP keepalives."""
        from psycopg.rows import dict_row

        never_prepare = {"prepare_threshold": None} if self.pooler == "transaction" else {}
        return {
            **never_prepare,
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": self.connect_attempt_seconds,
            # A peer that vanished (host down, network cut, a failover) is
            # noticed by TCP: no statement or LISTEN waits on it for longer.
            **dead_socket_options(self.dead_socket_seconds),
            "application_name": "mealquest",
        }

    @functools.cached_property
    def hosts(self) -> int:
        """How many hosts the URL names (`postgresql://H1,H2/db`): each is tried in turn."""
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            named = str(conninfo_to_dict(self.url).get("host") or "")
        except psycopg.Error:  # an invalid URL is refused where the pool opens
            return 1
        return max(1, len(named.split(",")))

    @functools.cached_property
    def connect_attempt_seconds(self) -> int:
        """How long each host has to answer (libpq counts whole seconds and
        waits at least 2). One host has the whole wait; several share it, so
        that a first host that never answers leaves time for the next one
        (with the whole wait each, a dark first host used it all, and a live
        second one was never tried)."""
        if self.hosts == 1:
            return max(2, math.ceil(self.busy_timeout_seconds))
        return max(2, math.floor(self.busy_timeout_seconds / self.hosts))

    @functools.cached_property
    def connect_wait_seconds(self) -> float:
        """How long a caller waits for a connection: the busy timeout, or, for
        several hosts whose shares at libpq's 2 s least do not fit in it, long
        enough for every host to be tried."""
        if self.hosts == 1:
            return self.busy_timeout_seconds
        return max(self.busy_timeout_seconds, self.hosts * self.connect_attempt_seconds + 1.0)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        # Set once per connection (not as a startup option, which PgBouncer refuses).
        # UTC: in another zone, a time at the calendar's edge (a job due in
        # year 1) reads as a year no datetime holds, and every read of it fails.
        # The ISO style: a claim reads its rows' times as the server's text
        # (`job_rows.as_text`), which the other styles write otherwise.
        # Through a transaction pooler they are made per transaction instead
        # (`_begin`): the next transaction may run on another server connection.
        if self.pooler == "transaction":
            return
        busy_ms = max(1, int(self.busy_timeout_seconds * 1000))
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false), "
            "set_config('TimeZone', 'UTC', false), set_config('DateStyle', 'ISO', false)",
            (f"{busy_ms}ms",),
        )

    def _open_pool(self) -> ConnectionPool[psycopg.Connection[dict[str, Any]]]:
        self._check_process()
        if self._pool is not None:
            return self._pool
        if monkey.is_module_patched("select"):
            # A gevent process must not import psycopg before patching; see `waiting`.
            require_cooperative_psycopg()
            self._cooperative = True
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        try:
            conninfo_to_dict(self.url)
        except psycopg.Error:
            # libpq's message quotes the faulty part, which may be the password.
            raise StoreError("the PostgreSQL URL is not valid") from None
        connection_class: type[psycopg.Connection[dict[str, Any]]] = psycopg.Connection
        if self._cooperative:
            from mealquest.db.postgresql.hub_wait import HubConnection

            connection_class = HubConnection
        pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            self.url,
            connection_class=connection_class,
            kwargs=self.connect_kwargs(),
            configure=self._configure,
            # Connections are made when needed, up to pool_size, and closed
            # after 10 idle minutes, so an idle process holds none for long.
            min_size=0,
            max_size=self.pool_size,
            timeout=self.connect_wait_seconds,
            # After an outage, give up retrying a lost connection soon: the
            # next caller then connects at once instead of after a backoff.
            reconnect_timeout=max(2.0, self.busy_timeout_seconds),
            name="mealquest",
            open=False,
        )
        pool.open(wait=False)
        self._pool = pool
        return pool

    # -- transactions -----------------------------------------------------------

    def write(
        self,
        fn: Callable[Concatenate[Transaction, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run `fn(tx, ...)` as one transaction: committed if it returns, rolled back if
        it raises."""

        def transaction(
            conn: psycopg.Connection[dict[str, Any]],
        ) -> tuple[T, list[Callable[[], None]]]:
            import psycopg
            from psycopg.pq import TransactionStatus

            tx = PostgresTransaction(conn, self.notifier)
            conn.execute(self._begin)
            result = fn(tx, *args, **kwargs)
            if conn.info.transaction_status == TransactionStatus.INERROR:
                # `fn` caught a failed statement: COMMIT would silently roll back.
                raise StoreError("a statement failed inside the transaction; it was rolled back")
            try:
                conn.execute("COMMIT")
            except psycopg.Error as error:
                if is_unavailable(error):
                    # The COMMIT was sent and its answer lost: it may have committed.
                    raise WriteOutcomeUnknown() from None
                raise
            return result, tx.after_commit_callbacks

        result, callbacks = self._with_connection(transaction)
        for callback in callbacks:
            callback()
        return result

    def write_now(
        self,
        fn: Callable[Concatenate[Transaction, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`write`: a PostgreSQL write already runs on the calling greenlet."""
        return self.write(fn, *args, **kwargs)

    def read(
        self,
        fn: Callable[Concatenate[Reads, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run the read `fn(conn, ...)` on a pooled connection: autocommit, or, through
        a transaction pooler, in a transaction of its own that carries the settings."""
        if self.pooler == "none":
            return self._with_connection(lambda conn: fn(conn, *args, **kwargs))

        def transaction(conn: psycopg.Connection[dict[str, Any]]) -> T:
            conn.execute(self._begin)
            result = fn(conn, *args, **kwargs)
            # COMMIT, as autocommit would have (after a failed statement the
            # server rolls back instead).
            conn.execute("COMMIT")
            return result

        return self._with_connection(transaction)

    def _with_connection(self, work: Callable[[psycopg.Connection[dict[str, Any]]], T]) -> T:
        pool = self._open_pool()
        import psycopg

        try:
            # The pool's own timeout ends this wait (connecting happens in its workers).
            conn = pool.getconn(timeout=self.connect_wait_seconds)
            deadline = time.monotonic() + self.busy_timeout_seconds
            try:
                return self._work_on(conn, work, deadline)
            finally:
                pool.putconn(conn)
        except psycopg.Error as error:
            if is_unavailable(error):
                raise StoreUnavailable() from None
            raise

    def _work_on(
        self,
        conn: psycopg.Connection[dict[str, Any]],
        work: Callable[[psycopg.Connection[dict[str, Any]]], T],
        deadline: float,
    ) -> T:
        # Where psycopg yields to the hub, a timer also covers a server that
        # stopped answering, which no statement_timeout can end. Elsewhere
        # nothing could interrupt the wait, and the server's timeouts bound it.
        backstop = None
        if self._cooperative:
            remaining = max(deadline - time.monotonic(), 0.0)
            backstop = gevent.Timeout(remaining + _BACKSTOP_GRACE_SECONDS)
            backstop.start()
        try:
            return work(conn)
        except gevent.Timeout as timeout:
            if timeout is not backstop:
                _settle(conn)
                raise
            # The connection's state is unknown: the pool replaces it.
            conn.close()
            raise StoreUnavailable() from None
        except BaseException as error:
            if getattr(error, "sqlstate", None) == _READ_ONLY_TRANSACTION:
                # A server that is (or became) a standby: this connection will
                # never write again. Closed, the pool replaces it, and a new
                # connection finds the primary (`target_session_attrs=read-write`
                # in a URL of several hosts).
                conn.close()
            else:
                _settle(conn)
            raise
        finally:
            if backstop is not None:
                backstop.close()

    # -- change detection -------------------------------------------------------

    def change_marker(self) -> None:
        """None: PostgreSQL has no cheap counter of every commit, so no read is
        answered from a cache (see `mealquest.read_cache`)."""

    def data_version(self) -> int:
        """A number that changes when another process may have enqueued a job.

        With LISTEN on, the count of notifications this process's listener
        received (plus its reconnects, after which some may have been
        missed). With it off, a number that changes every
        `_POLL_ONLY_VERSION_SECONDS`: the caller then looks for a due job.
        """
        self._check_process()
        if not self.listen:
            return int(time.monotonic() / _POLL_ONLY_VERSION_SECONDS)
        return self._started_listener().count

    def _started_listener(self) -> Listener:
        if self._listener is None:
            # Kept only once started: a kill between the two would leave a
            # listener that `close` cannot join.
            listener = Listener(self.url, self.connect_kwargs())
            listener.start()
            self._listener = listener
        return self._listener

    def job_changes(self, since: Hashable | None, /) -> tuple[Hashable, Collection[str] | None]:
        """With LISTEN on, the jobs other processes' writes named on the change
        channel since `since` (None: any job, after a reconnect or a burst too
        large to name). Without it, or while the listener is not listening, a
        mark that changes every `_POLL_ONLY_VERSION_SECONDS` and any job at
        each change: the caller then reads every job it watches."""
        self._check_process()
        if self.listen:
            listener = self._started_listener()
            if listener.listening:
                heard = since if isinstance(since, tuple) and since[:1] != ("tick",) else None
                return listener.changed_since(heard)
        tick = ("tick", int(time.monotonic() / _POLL_ONLY_VERSION_SECONDS))
        return tick, (() if since == tick else None)

    # -- lifecycle --------------------------------------------------------------

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise StoreUsedAcrossFork()

    def for_runner(self) -> PostgresStore:
        """A store of the same database with a pool of its own, made once: the
        runner's heartbeats, claims and outcomes never wait behind HTTP
        requests for a connection (a flood of them would otherwise let leases
        expire while their jobs run)."""
        if self._runner is None:
            self._runner = PostgresStore(
                self.url,
                busy_timeout_seconds=self.busy_timeout_seconds,
                pool_size=self.runner_pool_size,
                listen=self.listen,
                pooler=self.pooler,
                dead_socket_seconds=self.dead_socket_seconds,
            )
        return self._runner

    def _wake_listener(self, channel: str) -> None:
        """Send the notification that wakes a stopping listener (`Listener.stop`)
        on a pooled connection, within `_WAKE_SECONDS`; a store that never
        opened its pool has none to send it on."""
        pool = self._pool
        if pool is None:
            raise StoreError("no pool to send the wake-up from")
        conn = pool.getconn(timeout=_WAKE_SECONDS)
        try:
            self._work_on(
                conn,
                lambda conn: conn.execute("SELECT pg_notify(%s, '')", (channel,)),
                time.monotonic() + _WAKE_SECONDS,
            )
        finally:
            pool.putconn(conn)

    def close(self) -> None:
        """Stop the listener and close the pools' connections (same process only)."""
        if os.getpid() != self._pid:
            return
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self.notifier.cancel()
        if self._listener is not None:
            self._listener.stop(wake=self._wake_listener)
            self._listener = None
        if self._pool is not None:
            self._pool.close(timeout=self.busy_timeout_seconds)
            self._pool = None


def is_unavailable(error: Exception) -> bool:
    """Whether a psycopg error means the database (not the statement) failed."""
    import psycopg
    from psycopg_pool import PoolTimeout, TooManyRequests

    if isinstance(error, (PoolTimeout, TooManyRequests)):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate:
        return sqlstate[:2] in _UNAVAILABLE_CLASSES or sqlstate == _READ_ONLY_TRANSACTION
    # No SQLSTATE: the client's own failure to reach or hear the server.
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))


def _settle(conn: psycopg.Connection[Any]) -> None:
    """Leave a connection whose transaction failed idle, or closed for the pool to replace."""
    import psycopg
    from psycopg.pq import TransactionStatus

    status = conn.info.transaction_status
    if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            conn.close()
    elif status == TransactionStatus.ACTIVE:
        conn.close()
