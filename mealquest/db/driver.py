"""The driver contract: the one storage interface everything above the database uses.

A driver is a store with its SQL: `mealquest.db.sqlite` (the embedded
default) and `mealquest.db.postgresql` (several hosts, one database). Code
above `mealquest.db` sees only what this module declares: a `Store` that
runs transactions and reads, and one statement set per subject (`jobs`,
`households`, `recipes`, ...), each a `Protocol` that both drivers'
modules of that name satisfy with the same functions, arguments, results
and meaning. The type checker holds each driver module to its protocol,
and one statement-level suite (`tests/drivers/`) runs against both.

Statements take an open `Transaction` (writes, inside `Store.write`) or
something `Reads` runs on (reads, inside `Store.read`; a transaction reads
too). Rows come back as the values of `mealquest.model`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from mealquest.db.migrations import AppliedMigration, Ledger, Migration
from mealquest.model.households import Household
from mealquest.model.jobs import (
    ClaimRequest,
    HeldLease,
    Job,
    Lease,
    NewJob,
    Recovered,
    Status,
    Transition,
)
from mealquest.model.operators import Operator, OperatorListing
from mealquest.model.queue import QueueFigures
from mealquest.model.recipes import ParsedRecipe, Recipe

T = TypeVar("T")
P = ParamSpec("P")


class Cursor(Protocol):
    """What a statement answers, on either database."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Reads(Protocol):
    """A connection, or an open transaction: what a read runs its statements on."""

    def execute(self, sql: str, params: Any = ..., /) -> Cursor: ...


class Transaction(Reads, Protocol):
    """An open write transaction: all of it commits, or none of it.

    Callbacks given to `after_commit` run in the calling greenlet once the
    transaction has committed, never inside the database's own thread: that
    is where gevent objects (the pool's wake event) may be signalled.
    """

    def after_commit(self, callback: Callable[[], None], /) -> None: ...


class JobStatements(Protocol):
    """The job queue's statements: insert, claim, publish, transition (every
    state change a worker makes), renew, interrupt, rescue, and the reads.

    Every write after the claim is fenced on the lease (the job still
    `running`, held by that claim's owner, at that attempt); a fenced write
    that matches no row answers False and the caller treats the lease as lost.
    """

    def insert_job(self, tx: Transaction, job: NewJob, /) -> bool:
        """Queue `job`; False (nothing inserted) when the household already has a
        job holding its idempotency key: the unique index decides, so two
        concurrent enqueues cannot both insert."""
        ...

    def insert_jobs(self, tx: Transaction, jobs: Sequence[NewJob], /) -> None:
        """Queue jobs that hold no idempotency key, in their order, by one statement."""
        ...

    def release_unique_key(
        self, tx: Transaction, /, *, household_id: int, unique_key: str, older_than_seconds: float
    ) -> int:
        """Clear `unique_key` from the household's job holding it, if that job
        is older than `older_than_seconds` (its window is over)."""
        ...

    def holder_of_key(
        self, tx: Transaction, /, *, household_id: int, unique_key: str
    ) -> tuple[str, str] | None:
        """The (id, digest) of the household's job holding `unique_key`, if any."""
        ...

    def cancel_job(
        self, tx: Transaction, job_id: str, household_id: int | None = None, /
    ) -> Job | None:
        """Cancel a job (a queued one at once, a running one by request to its
        worker); the job as it now is (None: no such job for that household)."""
        ...

    def retry_job(
        self, tx: Transaction, job_id: str, household_id: int | None = None, /
    ) -> Job | None:
        """Queue a failed or cancelled job again, due now, with a fresh attempt budget."""
        ...

    def cancel_requested(self, tx: Transaction, leases: Iterable[Lease], /) -> set[str]:
        """The ids of the leased jobs whose cancel was requested."""
        ...

    def claim(self, tx: Transaction, request: ClaimRequest, /) -> list[Job]:
        """Claim up to `request.limit` due jobs, best priority first, households
        in turn within a priority; in the claim's order."""
        ...

    def publish(self, tx: Transaction, lease: Lease, /, *, result: str) -> bool:
        """Store a running job's partial result (fenced)."""
        ...

    def owns(self, tx: Transaction, lease: Lease, /) -> bool:
        """Whether the lease is still held."""
        ...

    def transition(self, tx: Transaction, change: Transition, /) -> bool:
        """Move the leased running job out of `running` (fenced)."""
        ...

    def transition_many(self, tx: Transaction, transitions: Sequence[Transition], /) -> list[bool]:
        """`transition` for each, in as few statements as the driver can."""
        ...

    def renew_leases(
        self, tx: Transaction, leases: Iterable[Lease], /, *, lease_seconds: float
    ) -> set[tuple[str, int]]:
        """Extend the leases still held; the (id, attempt) renewed."""
        ...

    def leases_of(self, tx: Transaction, owner: str, /) -> list[Lease]:
        """The leases of the running jobs one claim (by its fencing `owner`) holds."""
        ...

    def has_due_job(self, conn: Reads, kinds: Collection[str], /) -> bool:
        """Whether a job of one of `kinds` is queued and due (one index probe)."""
        ...

    def queued_of_other_kinds(self, conn: Reads, kinds: Collection[str], /) -> dict[str, int]:
        """Queued jobs by kind, for the kinds not in `kinds` (no handler here)."""
        ...

    def interrupt(self, tx: Transaction, leases: Iterable[Lease], /) -> Recovered:
        """Record jobs a stopping worker cut short (fenced), as their `on_interrupt` says."""
        ...

    def running_leases(self, conn: Reads, /) -> list[HeldLease]:
        """The lease of every running job, as the database holds it now."""
        ...

    def rescue_unrenewed(
        self, tx: Transaction, held: Sequence[HeldLease], /, *, now: datetime | None = None
    ) -> Recovered:
        """Interrupt each of `held` whose lease nobody renewed since it was read
        and that expired by the database's clock (or `now`), as the rows'
        `on_interrupt` says."""
        ...

    def get_job(self, conn: Reads, job_id: str, household_id: int | None = None, /) -> Job | None:
        """The job (of that household, with one given)."""
        ...

    def get_job_with_token(
        self, conn: Reads, job_id: str, token_sha256: str, /
    ) -> tuple[Household, Job | None] | None:
        """The household of a live token (by digest) and its job of that id, in one
        statement; None if the token is not live."""
        ...

    def list_jobs(
        self,
        conn: Reads,
        /,
        *,
        household_id: int | None = None,
        status: Status | None = None,
        kind: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Jobs newest first, filtered; `before_seq` continues a previous page."""
        ...

    def count_pending(self, tx: Transaction, household_id: int, at_most: int, /) -> int:
        """The household's queued and running jobs (its quota's use), counted so
        that the count holds until the transaction commits."""
        ...

    def household_load(self, conn: Reads, household_id: int, /) -> tuple[int, float | None]:
        """The household's running jobs, and the mean run time in seconds of its
        latest finished ones (None without any)."""
        ...


class HouseholdStatements(Protocol):
    """Households and the digests of their tokens."""

    def insert_household(self, tx: Transaction, /, *, name: str) -> int: ...

    def insert_token(self, tx: Transaction, /, *, household_id: int, token_sha256: str) -> int:
        """A token for the household (`UnknownHousehold` if there is none)."""
        ...

    def create_household(
        self, tx: Transaction, /, *, name: str, token_sha256: str
    ) -> tuple[int, int]:
        """A household with its first token: (household id, token id)."""
        ...

    def revoke_token(self, tx: Transaction, token_id: int, /) -> None:
        """Revoke a live token (`UnknownToken` if there is none)."""
        ...

    def list_households(self, conn: Reads, /) -> list[tuple[Household, int]]:
        """Every household with its number of live tokens."""
        ...

    def household_for_token_digest(self, conn: Reads, token_sha256: str, /) -> Household | None:
        """The household of a live token, by its digest."""
        ...


class RecipeStatements(Protocol):
    """Recipes that jobs imported."""

    def upsert_for_job(
        self,
        tx: Transaction,
        /,
        *,
        household_id: int,
        job_id: str,
        source_url: str,
        parsed: ParsedRecipe,
    ) -> Recipe:
        """Store the recipe a job imported, keyed on the job (a retried job
        updates the recipe it stored before)."""
        ...

    def get_recipe(self, conn: Reads, recipe_id: str, household_id: int, /) -> Recipe | None: ...

    def list_recipes(
        self, conn: Reads, /, *, household_id: int, before_seq: int | None, limit: int
    ) -> list[Recipe]:
        """A household's recipes, newest first."""
        ...


class PeriodicStatements(Protocol):
    """Scheduled times of periodic kinds that made their job (one each), and
    the database's clock they are judged by."""

    def current_time(self, tx: Reads, now: datetime | None = None, /) -> datetime: ...

    def first_seen(self, tx: Transaction, /, *, kind: str, moment: datetime) -> datetime:
        """When a scheduler first saw the kind (recorded at the first call)."""
        ...

    def claim_slot(self, tx: Transaction, /, *, kind: str, slot_at: datetime) -> bool:
        """Take the slot for this transaction; False if another scheduler did."""
        ...

    def record_job(
        self, tx: Transaction, /, *, kind: str, slot_at: datetime, job_id: str
    ) -> None: ...

    def delete_slots(
        self,
        tx: Transaction,
        /,
        *,
        older_than_seconds: float,
        limit: int,
        now: datetime | None = None,
    ) -> int:
        """Delete up to `limit` slots older than that; how many were."""
        ...


class RetentionStatements(Protocol):
    """Deleting finished jobs, a small batch per call."""

    def delete_finished(
        self,
        tx: Transaction,
        /,
        *,
        older_than_seconds: float,
        limit: int,
        now: datetime | None = None,
    ) -> int: ...


class OperatorStatements(Protocol):
    """Operators (who watch and steer the queue) and the digests of their tokens."""

    def insert_operator(self, tx: Transaction, /, *, name: str, token_sha256: str) -> int: ...

    def revoke_operator(self, tx: Transaction, operator_id: int, /) -> None:
        """Revoke a live operator (`UnknownOperator` if there is none)."""
        ...

    def list_operators(self, conn: Reads, /) -> list[OperatorListing]: ...

    def operator_for_token_digest(self, conn: Reads, token_sha256: str, /) -> Operator | None: ...


class SessionStatements(Protocol):
    """The dashboard's sign-ins, kept on the server by the digest of their id,
    so that signing out, or revoking the operator, ends every copy of the cookie."""

    def insert_session(
        self,
        tx: Transaction,
        /,
        *,
        id_sha256: str,
        operator_id: int,
        lifetime_seconds: float,
        keep: int,
    ) -> None:
        """A new session for the operator, lasting `lifetime_seconds`; expired
        sessions (anyone's) and the operator's beyond its newest `keep` go."""
        ...

    def delete_session(self, tx: Transaction, id_sha256: str, /) -> None: ...

    def delete_operator_sessions(self, tx: Transaction, operator_id: int, /) -> None: ...

    def session_operator(self, conn: Reads, id_sha256: str, /) -> Operator | None:
        """The live operator of an unexpired session, or None."""
        ...


class OperationStatements(Protocol):
    """The operator's views and actions across households."""

    def queue_figures(self, conn: Reads, now: datetime | None = None, /) -> QueueFigures: ...

    def fold_counts(self, tx: Transaction, /) -> None:
        """Fold the per-kind count deltas into their totals (keeps the figures' read cheap)."""
        ...

    def kinds_of(self, conn: Reads, job_ids: Collection[str], /) -> dict[str, str]: ...

    def delete_job(self, tx: Transaction, job_id: str, /) -> bool: ...


class Store(Protocol):
    """One process's access to its database, and why each part is there."""

    name: str
    """`sqlite` or `postgresql`: for logs and for tests that only one driver can run."""

    migrations_dir: Path
    """The driver's own migration files."""

    @property
    def jobs(self) -> JobStatements: ...

    @property
    def households(self) -> HouseholdStatements: ...

    @property
    def recipes(self) -> RecipeStatements: ...

    @property
    def periodic(self) -> PeriodicStatements: ...

    @property
    def retention(self) -> RetentionStatements: ...

    @property
    def operators(self) -> OperatorStatements: ...

    @property
    def sessions(self) -> SessionStatements: ...

    @property
    def operations(self) -> OperationStatements: ...

    def write(
        self, fn: Callable[Concatenate[Transaction, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn(tx, ...)` as one transaction: all of it commits or none. The
        only way anything is written, so that no transaction spans a greenlet
        switch and a deadline bounds every wait."""
        ...

    def read(
        self, fn: Callable[Concatenate[Reads, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run the pure read `fn(conn, ...)`; it may run more than once."""
        ...

    def data_version(self) -> int:
        """A number that changes when another process may have committed: the
        idle producer's cheap filter before it looks for a due job."""
        ...

    def change_marker(self) -> Hashable | None:
        """A value equal to an earlier one only if nothing has committed since
        that one was taken, from any connection, process or host; None when the
        database has no cheap way to tell (every read then goes to it). What
        lets `ReadCache` answer a read again without a stale answer."""
        ...

    def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write can commit now (for /healthz)."""
        ...

    @property
    def broken(self) -> bool:
        """Whether no write can ever succeed in this process again (restart it)."""
        ...

    def describe(self) -> str:
        """The database as messages may name it (never a password)."""
        ...

    def exists(self) -> bool:
        """Whether there is a database to migrate-check (a missing file is not created)."""
        ...

    def applied_migrations(self) -> dict[int, AppliedMigration]:
        """The database's migration ledger, read through the store (cooperatively)."""
        ...

    def upgrade(self, target: int | None = None) -> list[Migration]:
        """Apply pending migrations; the migrations applied."""
        ...

    def migration_status(self) -> Ledger:
        """The ledger: applied, pending and unknown migrations."""
        ...

    def for_runner(self) -> Store:
        """The store this process's job pool uses: on PostgreSQL one with
        connections of its own, which no flood of HTTP requests can take from
        the heartbeats and outcomes; on SQLite this one (its writes queue for
        its one writer thread, off the hub)."""
        ...

    def close(self) -> None:
        """Close this process's connections (the runner's too)."""
        ...
