"""The cyclic garbage collector of a process that serves or runs jobs, set once it has started.

Everything such a process has made by the time it serves (the app, its
modules, the job pool) lives as long as the process, yet the collector's
full collections walk all of it again (about 84,000 objects in a worker),
and the collections of the youngest objects, with Python's threshold of 700,
come every few jobs: each job makes dozens of objects (its row, its
greenlet, its context, its outcome, its log record) that live until its
outcome commits. Measured in a SQLite drain of 8,000 no-op jobs (the
collections timed by `gc.callbacks`), six interleaved rounds: 14-21 µs of
collection a job by default, 7-10 frozen, 5-8 frozen and collected every
10,000 young objects, of about 140 µs of the process's CPU a job.

Objects that form cycles (a traceback and its frames, greenlets linked to
each other) still go at the next young collection, a few hundred jobs later
at most; everything else is freed as before, by its reference count. A
job's own objects form none once its attempt is over (the executor drops
its context's link back to it), so a drain of no-op jobs makes no
collection at all.
"""

from __future__ import annotations

import gc

# Net new objects the collector tracks between collections of the youngest
# generation (Python's default: 700). The older generations keep their own.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Leave what the process has made so far out of every collection, and
    collect the young objects less often. Call once, when the process has
    started (its app and its pool made)."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
