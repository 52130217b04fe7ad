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

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from mealquest.db.migrations import AppliedMigration, Ledger, Migration
from mealquest.model.audit import AuditEntry
from mealquest.model.batches import Batch, BatchOutcome, NewBatch, Unblocked
from mealquest.model.history import History
from mealquest.model.households import Household, HouseholdFigures, HouseholdState, TokenInfo
from mealquest.model.jobs import (
    ClaimRequest,
    HeldLease,
    Job,
    Lease,
    LogLine,
    NewJob,
    PartitionLimits,
    PartitionState,
    PausedKind,
    Recovered,
    Status,
    Transition,
)
from mealquest.model.operations import BulkAction, BulkBatch, JobFilter
from mealquest.model.operators import Operator, OperatorListing
from mealquest.model.processes import ProcessEntry
from mealquest.model.queue import QueueFigures, Standing
from mealquest.model.recipes import ParsedRecipe, Recipe
from mealquest.model.signals import SignalResult, WaitState

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
        in turn within a priority; in the claim's order. Never a job of a
        paused kind, nor more of a partition than its limits let start."""
        ...

    def publish(self, tx: Transaction, lease: Lease, /, *, result: str) -> bool:
        """Store a running job's partial result (fenced)."""
        ...

    def owns(self, tx: Transaction, lease: Lease, /) -> bool:
        """Whether the lease is still held."""
        ...

    def add_log_lines(self, tx: Transaction, job_id: str, lines: Sequence[LogLine], /) -> None:
        """Keep lines a job's handler logged (its attempt's, numbered by it)."""
        ...

    def log_lines(self, conn: Reads, job_id: str, /) -> list[LogLine]:
        """A job's kept log lines, attempt by attempt, in the order logged."""
        ...

    def add_traceparents(self, tx: Transaction, traces: Sequence[tuple[str, str]], /) -> None:
        """Keep the W3C `traceparent` each new job was enqueued under (job id, value)."""
        ...

    def traceparents(self, conn: Reads, job_ids: Sequence[str], /) -> dict[str, str]:
        """The `traceparent` each of the jobs was enqueued under, by job id (none
        for a job enqueued with tracing off)."""
        ...

    def transition(self, tx: Transaction, change: Transition, /) -> bool:
        """Move the leased running job out of `running` (fenced)."""
        ...

    def transition_many(self, tx: Transaction, transitions: Sequence[Transition], /) -> list[bool]:
        """`transition` for each, in as few statements as the driver can."""
        ...

    def mark_waiting(self, tx: Transaction, job_id: str, name: str, prompt: str, /) -> bool:
        """After a wait's transition put the job back in the queue: mark it
        waiting for its household's signal `name`, its result the prompt. If
        the answer came meanwhile, the job is due now instead (True)."""
        ...

    def renew_leases(
        self, tx: Transaction, leases: Iterable[Lease], /, *, lease_seconds: float
    ) -> set[tuple[str, int]]:
        """Extend the leases still held; the (id, attempt) renewed."""
        ...

    def leases_of(self, tx: Transaction, owner: str, /) -> list[Lease]:
        """The leases of the running jobs one claim (by its fencing `owner`) holds."""
        ...

    def has_due_job(
        self,
        conn: Reads,
        kinds: Collection[str],
        /,
        *,
        partitions: Mapping[str, PartitionLimits] | None = None,
    ) -> bool:
        """Whether a job of one of `kinds` is queued and due that a claim could
        take now: not of a paused kind, nor (given the kinds' `partitions`)
        of a partition at a limit. One index probe unless jobs a claim would
        pass over come first."""
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

    def changed_jobs(self, conn: Reads, versions: Mapping[str, int], /) -> dict[str, Job | None]:
        """Each job of `versions` (id: the version known) whose version is now
        another: the job as it is, or None if it no longer exists. What a
        process's stream watcher reads for all its streams: a primary-key probe
        per job, in as few statements as the driver can, and only the jobs
        that changed come back whole."""
        ...

    def queue_standings(
        self, conn: Reads, jobs: Sequence[Job], /, *, at_most: int
    ) -> dict[str, Standing]:
        """The place in line of each queued job of `jobs` (`mealquest.db.standing`:
        claims played one at a time, bounded by `at_most`)."""
        ...

    def kind_run_seconds(self, conn: Reads, kind: str, /) -> float | None:
        """The mean run time in seconds of the kind's latest finished jobs (None
        without any)."""

    def running_job_ids(self, conn: Reads, household_id: int, /) -> list[str]:
        """The ids of the household's running jobs."""
        ...

    def delete_household_jobs(self, tx: Transaction, household_id: int, /, *, limit: int) -> int:
        """Delete up to `limit` of the household's jobs that are not running (its
        idempotency keys go with them); how many were."""
        ...


class HouseholdStatements(Protocol):
    """Households and the digests of their tokens."""

    def insert_household(self, tx: Transaction, /, *, name: str) -> int: ...

    def insert_token(
        self, tx: Transaction, /, *, household_id: int, token_sha256: str, name: str | None = None
    ) -> int:
        """A token for the household (`UnknownHousehold` if there is none)."""
        ...

    def list_tokens(self, conn: Reads, household_id: int, /) -> list[TokenInfo]:
        """The household's tokens, live and revoked, oldest first."""
        ...

    def record_token_use(self, tx: Transaction, token_sha256: str, /) -> None:
        """Note that a live token (by digest) was used now."""
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
        """The household of a live token, by its digest (`suspended` says whether
        its requests are to be refused)."""
        ...

    def get_household(self, conn: Reads, household_id: int, /) -> HouseholdState | None: ...

    def suspend_household(self, tx: Transaction, household_id: int, /) -> bool:
        """Suspend a household (its requests refused, its queued jobs left out of
        every claim); False if it already was. `UnknownHousehold`,
        `HouseholdErased` otherwise."""
        ...

    def resume_household(self, tx: Transaction, household_id: int, /) -> bool:
        """Lift a suspension; False if there was none. `UnknownHousehold`,
        `HouseholdErased` otherwise."""
        ...

    def mark_erased(self, tx: Transaction, household_id: int, /, *, name: str) -> None:
        """Make the household a tombstone: erased (and suspended) now, its name
        replaced by `name`; an erased one stays as it is. `UnknownHousehold`."""
        ...

    def delete_tokens(self, tx: Transaction, household_id: int, /, *, limit: int) -> int:
        """Delete up to `limit` of the household's tokens, live or revoked; how many were."""
        ...

    def household_figures(
        self,
        conn: Reads,
        /,
        *,
        after_id: int | None,
        limit: int,
        recent: int,
        household_id: int | None = None,
    ) -> list[HouseholdFigures]:
        """Households by id (after `after_id`; or the one `household_id`), each
        with its queued and running jobs, its final ones among its latest
        `recent` jobs, and its live tokens."""
        ...

    def erased_with_rows(self, conn: Reads, /, *, limit: int) -> list[int]:
        """Erased households that still have jobs or recipes (an erasure that
        running jobs held up), up to `limit`."""
        ...

    def live_token_digests(self, conn: Reads, digests: Collection[str], /) -> set[str]:
        """Those of `digests` whose tokens are live and whose households may use
        them (not suspended, not erased): one statement for many, what the
        stream watcher asks of all its streams' and long polls' tokens at once."""
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

    def recipes_of_jobs(
        self, conn: Reads, household_id: int, job_ids: Sequence[str], /
    ) -> list[Recipe]:
        """The recipes the household's jobs `job_ids` imported, in the jobs' order."""
        ...

    def list_recipes(
        self, conn: Reads, /, *, household_id: int, before_seq: int | None, limit: int
    ) -> list[Recipe]:
        """A household's recipes, newest first."""
        ...

    def delete_household_recipes(self, tx: Transaction, household_id: int, /, *, limit: int) -> int:
        """Delete up to `limit` of the household's recipes; how many were."""
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


class AuditStatements(Protocol):
    """The operators' audit log: one row per action, its count raised as the
    action's batches commit (each in the batch's own transaction)."""

    def insert_entry(
        self,
        tx: Transaction,
        /,
        *,
        operator_id: int | None,
        actor: str,
        action: str,
        target: str,
        count: int,
    ) -> int:
        """A new entry, at the database's now; its seq."""
        ...

    def add_to_count(self, tx: Transaction, seq: int, amount: int, /) -> None: ...

    def list_entries(
        self, conn: Reads, /, *, before_seq: int | None, limit: int
    ) -> list[AuditEntry]:
        """Entries newest first; `before_seq` continues a previous page."""
        ...

    def delete_entries(
        self,
        tx: Transaction,
        /,
        *,
        older_than_seconds: float,
        limit: int,
        now: datetime | None = None,
    ) -> int:
        """Delete up to `limit` entries older than that, oldest first; how many were."""
        ...


class HistoryStatements(Protocol):
    """The per-minute and per-ten-minute history of jobs' starts and ends
    (kept by triggers on `jobs`), read by the dashboard's charts."""

    def fold_history(self, tx: Transaction, /) -> None:
        """Fold noted events into the history (a driver that counts in place has
        nothing to fold)."""
        ...

    def history(
        self,
        conn: Reads,
        /,
        *,
        width: int,
        periods: int,
        since: datetime | None = None,
        now: datetime | None = None,
    ) -> History:
        """Each kind's periods among the last `periods` of `width` minutes (1 or
        10), up to the one the database's now (or `now`) is in, summed, with
        their percentiles' buckets; only those starting at or after `since`
        (the caller has the earlier ones)."""
        ...

    def duration_bounds(self, conn: Reads, /) -> list[float]:
        """The lower bound in seconds of each duration bucket, by bucket number."""
        ...

    def delete_history(
        self,
        tx: Transaction,
        /,
        *,
        width: int,
        older_than_seconds: float,
        limit: int,
        now: datetime | None = None,
    ) -> int:
        """Delete up to `limit` rows of `width` for periods that began more than
        that long ago; how many were."""
        ...


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

    def newest_seq(self, conn: Reads, /) -> int:
        """The `seq` of the newest job (0 without any): a bulk action acts on
        jobs up to the one its confirmation counted."""
        ...

    def count_matching(
        self,
        conn: Reads,
        status: Status,
        job_filter: JobFilter,
        /,
        *,
        upto_seq: int,
        at_most: int,
    ) -> int:
        """The jobs of `status` the filter matches with `seq` up to `upto_seq` that
        a bulk action would act on (of running ones, those not yet told to stop),
        counted up to `at_most`, through an index that bounds the count."""
        ...

    def act_on_batch(
        self,
        tx: Transaction,
        action: BulkAction,
        status: Status,
        job_filter: JobFilter,
        /,
        *,
        after_seq: int,
        upto_seq: int,
        limit: int,
    ) -> BulkBatch:
        """`action` on up to `limit` jobs of `status` the filter matches, with
        `seq` above `after_seq` and up to `upto_seq`, found through an index
        that bounds the batch. Every action takes the jobs it acts on out of
        what the next batch matches; the batch says where the next goes on."""
        ...


class FlowStatements(Protocol):
    """What operators and limits do to the flow of jobs: kinds paused for the
    whole deployment, and the partitions' state."""

    def pause_kind(self, tx: Transaction, kind: str, /, *, operator_id: int | None) -> bool:
        """Pause a kind (no claim takes its jobs); False if it already was."""
        ...

    def resume_kind(self, tx: Transaction, kind: str, /) -> bool:
        """Resume a paused kind; False if it was not paused."""
        ...

    def paused_kinds(self, conn: Reads, /) -> list[PausedKind]:
        """Every paused kind, by name."""
        ...

    def partition_state(self, conn: Reads, kind: str, partition_key: str, /) -> PartitionState:
        """A partition's running jobs and until when its rate leaves it out."""
        ...

    def delete_stale_rates(
        self,
        tx: Transaction,
        /,
        *,
        older_than_seconds: float,
        limit: int,
        now: datetime | None = None,
    ) -> int:
        """Delete up to `limit` partitions' rate ledgers with no start for that
        long (longer than any rate's window); how many were."""
        ...


class ProcessStatements(Protocol):
    """The registry of live processes: each job pool's entry, renewed at its
    heartbeat's rhythm; an entry not renewed for a lease is a process gone."""

    def register_process(
        self, tx: Transaction, entry: ProcessEntry, /, *, forget_after_seconds: float
    ) -> None:
        """Enter (or enter again) the process as started and seen now (the
        entry's own times are not read); entries of any process not seen for
        `forget_after_seconds` are deleted."""
        ...

    def renew_process(self, tx: Transaction, owner: str, /, *, busy: int) -> bool:
        """Mark the process seen now, running `busy` jobs; False if it has no entry."""
        ...

    def remove_process(self, tx: Transaction, owner: str, /) -> None: ...

    def live_processes(
        self, conn: Reads, /, *, stale_after_seconds: float, now: datetime | None = None
    ) -> list[ProcessEntry]:
        """The processes seen within `stale_after_seconds` of the database's clock
        (or `now`), oldest first."""
        ...


class SignalStatements(Protocol):
    """A job's durable steps, its waits for its household, and the household's
    answers (`ctx.step`, `ctx.wait_for`, `POST /jobs/{id}/signals/{name}`)."""

    def kept_step(self, conn: Reads, job_id: str, name: str, /) -> str | None:
        """The JSON a step of the job kept, or None if it ran to no end yet."""
        ...

    def keep_step(self, tx: Transaction, lease: Lease, name: str, result: str, /) -> bool:
        """Keep a step's JSON result, fenced on the lease (False: the lease is
        no longer held, and nothing is kept). A step kept already keeps its
        first result."""
        ...

    def wait_state(self, conn: Reads, job_id: str, name: str, /) -> WaitState:
        """The household's answer to the job's signal `name`, and whether the
        wait for it has timed out, by the database's clock."""
        ...

    def begin_wait(
        self, tx: Transaction, lease: Lease, name: str, timeout_seconds: float, /
    ) -> float | None:
        """Begin the job's wait for `name` unless it began already (its
        deadline `timeout_seconds` from now), fenced on the lease; the
        seconds left until its deadline (None: the lease is no longer held)."""
        ...

    def signal(
        self,
        tx: Transaction,
        job_id: str,
        name: str,
        payload: str,
        /,
        *,
        household_id: int | None,
        idempotency_key: str | None = None,
    ) -> SignalResult:
        """Store the household's answer to the job's signal `name`: the job
        due now if it waits for it, kept for its wait if it has not reached
        it; refused if it is final, waits for another signal or has this one
        (see `Signaled`). `idempotency_key` makes a repeat answer as it did."""
        ...

    def waiting_jobs(
        self, conn: Reads, /, *, household_id: int | None = None, limit: int = 50
    ) -> list[Job]:
        """Queued jobs waiting for their household (of one, or of all), the
        soonest to time out first."""
        ...

    def waiting_summary(self, conn: Reads, /) -> tuple[int, float | None]:
        """How many jobs wait for their household, and the seconds until the
        soonest of their waits times out (None: none waits)."""
        ...


class StreamStatements(Protocol):
    """Households' open event streams, counted against their limit across
    every process and host; a stream whose process stopped renewing it stops
    counting once it is `stale_after_seconds` old."""

    def open_stream(
        self,
        tx: Transaction,
        /,
        *,
        stream_id: str,
        household_id: int,
        owner: str,
        at_most: int,
        stale_after_seconds: float,
    ) -> float | None:
        """Open the stream unless the household holds `at_most` live ones: None
        when opened, else the age in seconds of its oldest live stream."""
        ...

    def close_stream(self, tx: Transaction, stream_id: str, /) -> None: ...

    def renew_streams(self, tx: Transaction, owner: str, /, *, stale_after_seconds: float) -> int:
        """Mark the owner's streams seen now (how many) and delete any stream
        stale for twice `stale_after_seconds`."""
        ...


class BatchStatements(Protocol):
    """Jobs that wait for others (`depends_on`) and batches (`enqueue_batch`)."""

    def missing_jobs(self, tx: Reads, household_id: int, job_ids: Collection[str], /) -> set[str]:
        """Those of `job_ids` that are no job of the household."""
        ...

    def insert_dependencies(self, tx: Transaction, jobs: Sequence[NewJob], /) -> None:
        """Record what each inserted job waits for (its `depends_on`)."""
        ...

    def insert_batch(self, tx: Transaction, batch: NewBatch, /) -> None: ...

    def get_batch(
        self, conn: Reads, batch_id: str, household_id: int | None = None, /
    ) -> Batch | None: ...

    def household_batches(self, conn: Reads, household_id: int, /, *, limit: int) -> list[Batch]:
        """The household's newest batches, newest first."""
        ...

    def batch_job_ids(self, conn: Reads, batch_id: str, /) -> list[str]: ...

    def batch_of_member(self, conn: Reads, job_id: str, /) -> str | None:
        """The id of the batch that job is a member of, if any."""
        ...

    def batch_outcome(self, conn: Reads, callback_job_id: str, /) -> BatchOutcome | None:
        """The members by outcome of the batch whose callback that job is."""
        ...

    def has_dependencies(self, conn: Reads, /) -> bool: ...

    def delete_empty_batches(self, tx: Transaction, /, *, limit: int) -> int:
        """Delete batches none of whose jobs (members, callback) is kept; how many."""
        ...

    def delete_household_batches(self, tx: Transaction, household_id: int, /, *, limit: int) -> int:
        """Delete the household's batches (an erasure: its jobs go too); how many."""
        ...

    def resolve_dependencies(
        self, tx: Transaction, /, *, limit: int, depends_on: Sequence[str] | None = None
    ) -> Unblocked:
        """One pass of the unblocker: dependencies on final jobs resolved (only
        those on the jobs of `depends_on`, through its index, when given), the
        jobs waiting for them made due or cancelled."""
        ...


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
    def batches(self) -> BatchStatements: ...

    @property
    def recipes(self) -> RecipeStatements: ...

    @property
    def periodic(self) -> PeriodicStatements: ...

    @property
    def retention(self) -> RetentionStatements: ...

    @property
    def operators(self) -> OperatorStatements: ...

    @property
    def audit(self) -> AuditStatements: ...

    @property
    def history(self) -> HistoryStatements: ...

    @property
    def sessions(self) -> SessionStatements: ...

    @property
    def operations(self) -> OperationStatements: ...

    @property
    def flow(self) -> FlowStatements: ...

    @property
    def processes(self) -> ProcessStatements: ...

    @property
    def streams(self) -> StreamStatements: ...

    @property
    def signals(self) -> SignalStatements: ...

    def write(
        self, fn: Callable[Concatenate[Transaction, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn(tx, ...)` as one transaction: all of it commits or none. The
        only way anything is written, so that no transaction spans a greenlet
        switch and a deadline bounds every wait."""
        ...

    def write_now(
        self, fn: Callable[Concatenate[Transaction, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`write`, for a short write its caller waits for (a single enqueue):
        a driver may run it on the calling thread when nothing can make it
        wait there. `fn` may run more than once, as a retried write's may."""
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

    def job_changes(self, since: Hashable | None, /) -> tuple[Hashable, Collection[str] | None]:
        """A mark of now, and the ids of the jobs written since the mark `since`:
        None when any job may have been (or `since` is None), empty when none
        was. Cheap enough to ask every few milliseconds: what lets one watcher
        per process read only the jobs that changed, and only when some did."""
        ...

    def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write can commit now (for /healthz)."""
        ...

    def forget_deleted(self, timeout_seconds: float) -> bool:
        """Leave no copy of deleted rows in the database's own files, as far as
        the database allows (after an erasure); whether that is done. SQLite:
        its WAL is checkpointed and truncated (deleted rows' bytes are already
        overwritten: `secure_delete`). PostgreSQL keeps dead tuples until
        VACUUM, and its WAL, archives and backups: nothing to do here."""
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
