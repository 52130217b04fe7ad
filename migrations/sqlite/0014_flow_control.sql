-- Flow control: paused kinds, snoozed jobs, and limits per partition.
--
-- paused_kinds holds a row per kind no claim takes (anywhere: every claim
-- reads it in its own statement); its running jobs finish. operator_id is
-- the operator who paused it from the dashboard, NULL from the CLI.
CREATE TABLE paused_kinds (
    kind TEXT PRIMARY KEY CHECK (kind <> ''),
    paused_at TEXT NOT NULL,
    operator_id INTEGER REFERENCES operators (id) ON DELETE SET NULL
) WITHOUT ROWID;

-- snoozes counts the times a job's handler put it off (`Snooze`), which
-- spends no attempt; past the limit the job fails. partition_key is the
-- partition of its payload that its kind's per-partition limits count it
-- in, computed at enqueue (NULL: no partition, no limit).
ALTER TABLE jobs ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0 CHECK (snoozes >= 0);
ALTER TABLE jobs ADD COLUMN partition_key TEXT
    CHECK (partition_key IS NULL OR length(partition_key) BETWEEN 1 AND 255);

-- Running jobs by partition: what a claim counts against a partition's
-- limit (only running rows that have a partition, so no other row costs it).
CREATE INDEX jobs_partition_running ON jobs (kind, partition_key)
    WHERE status = 'running' AND partition_key IS NOT NULL;

-- The starts of each partition of a kind with a rate, written by the claims
-- that start its jobs: `starts` the latest (at most the rate's count) start
-- times, a JSON array of fixed-width UTC text, oldest first; `blocked_until`
-- when the oldest of them leaves the rate's window, set while the window is
-- full (the claims leave the partition out until then); `last_started_at`
-- the newest, by which retention finds rows no claim needs any more.
CREATE TABLE partition_rates (
    kind TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    starts TEXT NOT NULL,
    blocked_until TEXT,
    last_started_at TEXT NOT NULL,
    PRIMARY KEY (kind, partition_key)
) WITHOUT ROWID;

-- The partitions at their rate now: the claim reads only those.
CREATE INDEX partition_rates_blocked ON partition_rates (blocked_until)
    WHERE blocked_until IS NOT NULL;
-- Rows of partitions not started for long, which retention deletes.
CREATE INDEX partition_rates_last_started ON partition_rates (last_started_at);
