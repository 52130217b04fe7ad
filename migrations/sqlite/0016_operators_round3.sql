-- What operators need beyond the queue: households they can suspend or
-- erase, a log of what they did, and the history behind the dashboard's
-- charts. Times are fixed-width RFC 3339 UTC text, compared as text.

-- A suspended household's API requests are refused (403
-- household_suspended) and every claim leaves its queued jobs out, until it
-- is resumed. An erased household keeps only this row, as a tombstone: its
-- name replaced, its tokens, jobs and recipes deleted. The row stays so that
-- its id is never given to another household (SQLite gives a new row the
-- highest id plus one, so deleting the newest household would hand its id to
-- the next one, and the audit log, logs and metrics would then name two
-- households by one id), so that audit records keep naming it, and so that
-- the prune job can finish an erasure that jobs still running held up. An
-- erased household is suspended too. Partial indexes: few rows are either,
-- and every claim reads the suspended ones.
ALTER TABLE households ADD COLUMN suspended_at TEXT;
ALTER TABLE households ADD COLUMN erased_at TEXT;
CREATE INDEX households_suspended ON households (id) WHERE suspended_at IS NOT NULL;
CREATE INDEX households_erased ON households (id) WHERE erased_at IS NOT NULL;

-- Every operator action (a sign-in, a job's cancel, retry or delete, a bulk
-- action, a household's suspension, resumption or erasure, a kind paused or
-- resumed): who (`actor`: the operator's name, or the command line and its
-- user; `operator_id` when an operator signed in), what (`action`, and its
-- `target`: a job, a filter, a household, a kind), how many jobs or rows it
-- touched (`count`, raised batch by batch as a long action goes) and when.
-- Deleted with the jobs, after MEALQUEST_JOB_RETENTION_DAYS.
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    operator_id INTEGER REFERENCES operators (id),
    actor TEXT NOT NULL CHECK (length(actor) BETWEEN 1 AND 300),
    action TEXT NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    target TEXT NOT NULL CHECK (length(target) <= 500),
    count INTEGER NOT NULL CHECK (count >= 0)
);

-- Retention deletes the oldest records first.
CREATE INDEX audit_log_at ON audit_log (at);

-- The durations the history counts, in buckets: bucket 0 holds [0, 10 ms),
-- bucket k (1 to 46) holds [lower_seconds(k), lower_seconds(k + 1)), each
-- √2 times as wide as the one before (10 ms times √2 to the power k - 1),
-- and bucket 47 everything from about 23.3 hours. A duration is counted in
-- the bucket with the greatest lower bound at or below it. The dashboard reads
-- the bounds from here, so this table is their one definition.
CREATE TABLE job_duration_buckets (
    bucket INTEGER PRIMARY KEY,
    lower_seconds REAL NOT NULL UNIQUE
);

INSERT INTO job_duration_buckets (bucket, lower_seconds) VALUES
    (0, 0.0),
    (1, 0.01),
    (2, 0.014142136),
    (3, 0.02),
    (4, 0.028284271),
    (5, 0.04),
    (6, 0.056568542),
    (7, 0.08),
    (8, 0.113137085),
    (9, 0.16),
    (10, 0.22627417),
    (11, 0.32),
    (12, 0.45254834),
    (13, 0.64),
    (14, 0.90509668),
    (15, 1.28),
    (16, 1.81019336),
    (17, 2.56),
    (18, 3.62038672),
    (19, 5.12),
    (20, 7.240773439),
    (21, 10.24),
    (22, 14.481546879),
    (23, 20.48),
    (24, 28.963093757),
    (25, 40.96),
    (26, 57.926187515),
    (27, 81.92),
    (28, 115.85237503),
    (29, 163.84),
    (30, 231.704750059),
    (31, 327.68),
    (32, 463.409500118),
    (33, 655.36),
    (34, 926.819000237),
    (35, 1310.72),
    (36, 1853.638000474),
    (37, 2621.44),
    (38, 3707.276000947),
    (39, 5242.88),
    (40, 7414.552001895),
    (41, 10485.76),
    (42, 14829.104003789),
    (43, 20971.52),
    (44, 29658.208007579),
    (45, 41943.04),
    (46, 59316.416015157),
    (47, 83886.08);

-- The dashboard's charts: for each kind, per minute (`width` 1) and per ten
-- minutes (`width` 10, `period` its first minute), how many jobs started
-- after waiting how long (`series` 'wait': from the job's due time, `run_at`,
-- which is its enqueue time unless it was delayed or is a retry's backoff,
-- to its start), and how many attempts ended how after running how long
-- (`series` the status the job left `running` for, 'retried' when it went
-- back to the queue; a queued job cancelled counts as 'cancelled' with
-- `bucket` -1: it never ran). Kept by the triggers below in the transaction
-- that moves the job, so no writer can forget it; one small upsert per
-- width and event, on rows a minute shares. A chart reads one row per
-- bucket used, never the jobs table: its cost grows with kinds and periods,
-- not with jobs. Rows older than the charts show are deleted by the prune
-- job. `period` is 'YYYY-MM-DDTHH:MM' (UTC), the start of its minute or of its
-- ten minutes.
CREATE TABLE job_history (
    width INTEGER NOT NULL CHECK (width IN (1, 10)),
    period TEXT NOT NULL,
    kind TEXT NOT NULL,
    series TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    count INTEGER NOT NULL CHECK (count >= 1),
    PRIMARY KEY (width, period, kind, series, bucket)
) WITHOUT ROWID;

-- A bucket that cannot be found (a time missing or that does not parse) is
-- bucket 0, and a start without its time counts at the row's update, so
-- that no claim or outcome can fail for the charts' sake.
CREATE TRIGGER job_history_started AFTER UPDATE OF status ON jobs
WHEN OLD.status = 'queued' AND NEW.status = 'running'
BEGIN
    INSERT INTO job_history (width, period, kind, series, bucket, count)
    SELECT w.width,
        CASE w.width WHEN 1 THEN substr(coalesce(NEW.started_at, NEW.updated_at), 1, 16)
            ELSE substr(coalesce(NEW.started_at, NEW.updated_at), 1, 15) || '0' END,
        NEW.kind, 'wait',
        coalesce((SELECT bucket FROM job_duration_buckets
                  WHERE lower_seconds <= max(0.0,
                      (julianday(NEW.started_at) - julianday(NEW.run_at)) * 86400.0)
                  ORDER BY lower_seconds DESC LIMIT 1), 0),
        1
    FROM (SELECT 1 AS width UNION ALL SELECT 10) AS w WHERE true
    ON CONFLICT (width, period, kind, series, bucket) DO UPDATE SET count = count + 1;
END;

CREATE TRIGGER job_history_ended AFTER UPDATE OF status ON jobs
WHEN OLD.status = 'running' AND NEW.status <> 'running'
BEGIN
    INSERT INTO job_history (width, period, kind, series, bucket, count)
    SELECT w.width,
        CASE w.width WHEN 1 THEN substr(NEW.updated_at, 1, 16)
            ELSE substr(NEW.updated_at, 1, 15) || '0' END,
        NEW.kind,
        CASE NEW.status WHEN 'queued' THEN 'retried' ELSE NEW.status END,
        coalesce((SELECT bucket FROM job_duration_buckets
                  WHERE lower_seconds <= max(0.0,
                      (julianday(NEW.updated_at) - julianday(NEW.started_at)) * 86400.0)
                  ORDER BY lower_seconds DESC LIMIT 1), 0),
        1
    FROM (SELECT 1 AS width UNION ALL SELECT 10) AS w WHERE true
    ON CONFLICT (width, period, kind, series, bucket) DO UPDATE SET count = count + 1;
END;

CREATE TRIGGER job_history_cancelled_queued AFTER UPDATE OF status ON jobs
WHEN OLD.status = 'queued' AND NEW.status = 'cancelled'
BEGIN
    INSERT INTO job_history (width, period, kind, series, bucket, count)
    SELECT w.width,
        CASE w.width WHEN 1 THEN substr(NEW.updated_at, 1, 16)
            ELSE substr(NEW.updated_at, 1, 15) || '0' END,
        NEW.kind, 'cancelled', -1, 1
    FROM (SELECT 1 AS width UNION ALL SELECT 10) AS w WHERE true
    ON CONFLICT (width, period, kind, series, bucket) DO UPDATE SET count = count + 1;
END;

-- The history of the last day, from the jobs already in the table, so the
-- charts are not empty after the upgrade (through `jobs_finished`).
INSERT INTO job_history (width, period, kind, series, bucket, count)
SELECT w.width,
    CASE w.width WHEN 1 THEN substr(j.finished_at, 1, 16)
        ELSE substr(j.finished_at, 1, 15) || '0' END,
    j.kind, j.status,
    CASE WHEN j.started_at IS NULL THEN -1 ELSE coalesce((SELECT bucket FROM job_duration_buckets
        WHERE lower_seconds <= max(0.0,
            (julianday(j.finished_at) - julianday(j.started_at)) * 86400.0)
        ORDER BY lower_seconds DESC LIMIT 1), 0) END,
    count(*)
FROM jobs AS j, (SELECT 1 AS width UNION ALL SELECT 10) AS w
WHERE j.finished_at IS NOT NULL
AND j.finished_at >= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-1 day')
GROUP BY 1, 2, 3, 4, 5;

INSERT INTO job_history (width, period, kind, series, bucket, count)
SELECT w.width,
    CASE w.width WHEN 1 THEN substr(j.started_at, 1, 16)
        ELSE substr(j.started_at, 1, 15) || '0' END,
    j.kind, 'wait',
    coalesce((SELECT bucket FROM job_duration_buckets
        WHERE lower_seconds <= max(0.0,
            (julianday(j.started_at) - julianday(j.run_at)) * 86400.0)
        ORDER BY lower_seconds DESC LIMIT 1), 0),
    count(*)
FROM jobs AS j, (SELECT 1 AS width UNION ALL SELECT 10) AS w
WHERE j.finished_at IS NOT NULL AND j.started_at IS NOT NULL
AND j.finished_at >= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-1 day')
AND j.started_at >= strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-1 day')
GROUP BY 1, 2, 3, 4, 5;
