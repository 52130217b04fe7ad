"""What both drivers' claims share about limits per partition: the rate's ledger.

A kind's partition may be limited two ways, both enforced by the claim
statement itself (so exact wherever the claim is: SQLite's writes take
turns, and on PostgreSQL claims that could take such a kind do so under a
transaction advisory lock per kind):

* **running at once**: counted from the running jobs that have a partition
  (a partial index holds only those, so the count costs what runs);
* **a rate**, `count` starts in any window of `per_seconds`: a sliding
  window, exact, kept in `partition_rates`, one row per partition that a
  claim started a job of. The row holds the partition's latest starts (at
  most `count`: an older one can no longer decide anything) and, while
  they fill the window, `blocked_until`: when the oldest leaves it. A claim
  reads only the rows blocked now (through their partial index) to leave
  those partitions out, and the rows of the partitions it picks to know how
  many more each may start; the claim that starts jobs of a partition
  writes its row in the same transaction.

Why a ledger and not the jobs' own `started_at`: a job's `started_at` is its
latest start, so a job retried or snoozed within the window would hide its
earlier start, and counting every start of a window from the jobs would read
as many rows as started (thousands a minute at 1,000 partitions) where the
ledger reads at most `count` per partition picked. A start that claims later
put back unrun (a lost claim's answer) stays counted: the rate errs only
towards starting less.

Starts are the claim's moments on the database's clock. On PostgreSQL two
claims' moments (their transactions' starts) may commit out of order; a
start counts every recorded start after its moment minus the window, later
ones included, which is what keeps any window of `per_seconds` to `count`
starts even so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from mealquest.model.jobs import Job, PartitionLimits, Rate

# A partition of a kind: (kind, partition_key).
Partition = tuple[str, str]


def rated_starts(
    claimed: Iterable[Job], partitions: Mapping[str, PartitionLimits]
) -> dict[Partition, int]:
    """How many jobs a claim started in each partition whose kind has a rate."""
    started: dict[Partition, int] = defaultdict(int)
    for job in claimed:
        limits = partitions.get(job.kind)
        if limits is not None and limits.rate is not None and job.partition_key is not None:
            started[(job.kind, job.partition_key)] += 1
    return dict(started)


def kept_starts(
    previous: Sequence[datetime], moment: datetime, started: int, rate: Rate
) -> tuple[list[datetime], datetime | None]:
    """A partition's ledger after `started` starts at `moment`: its latest
    starts (at most the rate's count, oldest first) and `blocked_until`
    (None while the window has room).

    A start at `t` is allowed while fewer than `count` recorded starts are
    after `t - per_seconds`; so with `count` of them kept, the partition has
    room again once the oldest is `per_seconds` old."""
    window = timedelta(seconds=rate.per_seconds)
    recent = [start for start in previous if start > moment - window]
    kept = sorted(recent + [moment] * started)[-rate.count :]
    blocked_until = kept[0] + window if len(kept) >= rate.count else None
    return kept, blocked_until


def limited_kinds(kinds: Iterable[str], partitions: Mapping[str, PartitionLimits]) -> list[str]:
    """The kinds of a claim whose partitions have limits, in one order."""
    return sorted(kind for kind in set(kinds) if kind in partitions)
