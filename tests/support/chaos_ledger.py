"""The chaos test's ledger, and the verdict on what it shows.

Each run of the `ledger_run` kind appends a `start` line when it begins and
an `end` line when its work is done (`start JOB PID CLAIM TIME`), from
whatever process ran it (`append`, whole even when the chaos kills the
process as it writes: `tests.support.shared_lines`). A job run more than
once is explained only by a lease provably lost (SPEC 13.1):

* each run after the first ran under a claim of its own: two runs under one
  claim are never explained;
* and the earlier run's process was killed after that run's start and
  before the later run's start, or the earlier run's fenced outcome write
  was refused (its process logged that the lease was gone, for that job),
  or the earlier run's claim was rescued: a rescuer logged that the lease
  of that claim, for that job, had expired and re-queued the job. The
  database then holds the fence shut on that claim, so its write would be
  refused; the rescue is the proof when its process was killed before it
  could try (seen through PgBouncer: an outcome written in vain through two
  outages for longer than a lease, its process killed before the refusal).

Runs of a job whose enqueue no client saw answered (a key that inserted
twice) are counted apart: they must be none.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import shared_lines

# The line a process logs when a job's fenced outcome write found the lease gone.
LEASE_LOST = "job was no longer ours when its outcome was recorded"
# The line a rescuer logs when it took back a job whose lease had expired.
RESCUED = "re-queued a job whose lease expired"
_LOGGED_CLAIM = re.compile(r"\bclaim=(\S+?)[\] ]")
# The text log format: `DATE TIME PID LEVEL logger: message [job_id=... ...]`.
_LOGGED_PID = re.compile(r"^\S+ \S+ (\d+) ")
_LOGGED_JOB = re.compile(r"\bjob_id=([0-9a-f]+)")


@dataclass
class Run:
    """One run of a job: where and under which claim it ran, and when."""

    job_id: str
    pid: int
    claim: str
    started: float
    ended: float | None = None


@dataclass
class Verdict:
    """The jobs run more than once, by why, and the runs no answer explains."""

    twice_killed: set[str] = field(default_factory=set)
    twice_fenced: set[str] = field(default_factory=set)
    unexplained: dict[str, list[Run]] = field(default_factory=dict)
    unanswered: dict[str, list[Run]] = field(default_factory=dict)


def append(path: str, what: str, job_id: str, claim: str) -> None:
    """Append this process's line of a run's `what` (`start`, `end`), now."""
    shared_lines.append(path, f"{what} {job_id} {os.getpid()} {claim} {time.time()!r}")


def read(path: Path) -> dict[str, list[Run]]:
    """Each job's runs, in the order they started."""
    runs: dict[str, list[Run]] = defaultdict(list)
    if not path.exists():
        return runs
    open_runs: dict[tuple[str, int, str], Run] = {}
    for line in path.read_text().splitlines():
        what, job_id, pid, claim, moment = line.split()
        key = (job_id, int(pid), claim)
        if what == "start":
            run = Run(job_id, int(pid), claim, float(moment))
            runs[job_id].append(run)
            open_runs[key] = run
        elif key in open_runs:
            open_runs.pop(key).ended = float(moment)
    for job_runs in runs.values():
        job_runs.sort(key=lambda run: run.started)
    return runs


def completed(runs: Mapping[str, list[Run]]) -> set[str]:
    """The jobs with a run that did its work to the end."""
    return {job_id for job_id, job_runs in runs.items() if any(r.ended for r in job_runs)}


def _lines_saying(logs: Iterable[str], words: str) -> Iterator[str]:
    """The processes' text log lines that say `words`."""
    for log in logs:
        yield from (line for line in log.splitlines() if words in line)


def fenced_writes(logs: Iterable[str]) -> set[tuple[str, int]]:
    """(job, pid) of each outcome write refused as the lease was gone, from
    the processes' text logs."""
    found = set()
    for line in _lines_saying(logs, LEASE_LOST):
        pid, job = _LOGGED_PID.match(line), _LOGGED_JOB.search(line)
        if pid and job:
            found.add((job.group(1), int(pid.group(1))))
    return found


def rescued_claims(logs: Iterable[str]) -> set[tuple[str, str]]:
    """(job, claim) of each lease a rescuer found expired and took back, from
    the processes' text logs."""
    found = set()
    for line in _lines_saying(logs, RESCUED):
        job, claim = _LOGGED_JOB.search(line), _LOGGED_CLAIM.search(line)
        if job and claim:
            found.add((job.group(1), claim.group(1)))
    return found


def judge(
    runs: Mapping[str, list[Run]],
    *,
    answered: set[str],
    kills: Mapping[int, float],
    fenced: set[tuple[str, int]],
    rescued: Collection[tuple[str, str]] = (),
) -> Verdict:
    """Why each job ran more than once (see the module); `kills`: when each
    pid the test killed was killed (wall clock)."""
    verdict = Verdict()
    for job_id, job_runs in runs.items():
        if job_id not in answered:
            verdict.unanswered[job_id] = job_runs
        for earlier, later in itertools.pairwise(job_runs):
            killed_at = kills.get(earlier.pid)
            if earlier.claim == later.claim:
                verdict.unexplained[job_id] = job_runs
            elif killed_at is not None and earlier.started < killed_at < later.started:
                verdict.twice_killed.add(job_id)
            elif (job_id, earlier.pid) in fenced or (job_id, earlier.claim) in rescued:
                verdict.twice_fenced.add(job_id)
            else:
                verdict.unexplained[job_id] = job_runs
    for job_id in verdict.unexplained:
        verdict.twice_killed.discard(job_id)
        verdict.twice_fenced.discard(job_id)
    verdict.twice_fenced -= verdict.twice_killed
    return verdict
