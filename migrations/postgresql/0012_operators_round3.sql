-- What operators need beyond the queue, as SQLite's
-- 0016_operators_round3.sql has it: households they can suspend or erase, a
-- log of what they did, and the history behind the dashboard's charts.

-- A suspended household's API requests are refused (403
-- household_suspended) and every claim leaves its queued jobs out, until it
-- is resumed. An erased household keeps only this row, as a tombstone: its
-- name replaced, its tokens, jobs and recipes deleted. The row stays so that
-- audit records keep naming it and the prune job can finish an erasure that
-- jobs still running held up (and, as on SQLite, so that no other household
-- could ever be given its id). An erased household is suspended too.
-- Partial indexes: few rows are either, and every claim reads the suspended
-- ones.
ALTER TABLE households ADD COLUMN suspended_at timestamptz;
ALTER TABLE households ADD COLUMN erased_at timestamptz;
CREATE INDEX households_suspended ON households (id) WHERE suspended_at IS NOT NULL;
CREATE INDEX households_erased ON households (id) WHERE erased_at IS NOT NULL;

-- Every operator action: who (`actor`: the operator's name, or the command
-- line and its user; `operator_id` when an operator signed in), what
-- (`action`, and its `target`), how many jobs or rows it touched (`count`,
-- raised batch by batch as a long action goes) and when. Deleted with the
-- jobs, after MEALQUEST_JOB_RETENTION_DAYS.
CREATE TABLE audit_log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    operator_id bigint REFERENCES operators (id),
    actor text NOT NULL CHECK (char_length(actor) BETWEEN 1 AND 300),
    action text NOT NULL CHECK (char_length(action) BETWEEN 1 AND 64),
    target text NOT NULL CHECK (char_length(target) <= 500),
    count bigint NOT NULL CHECK (count >= 0)
);

-- Retention deletes the oldest records first.
CREATE INDEX audit_log_at ON audit_log (at);

-- The durations the history counts, in buckets: bucket 0 holds [0, 10 ms),
-- bucket k (1 to 46) holds [lower_seconds(k), lower_seconds(k + 1)), each
-- √2 times as wide as the one before, and bucket 47 everything from about
-- 23.3 hours. The same bounds as SQLite's; the dashboard reads them from here.
CREATE TABLE job_duration_buckets (
    bucket smallint PRIMARY KEY,
    lower_seconds double precision NOT NULL UNIQUE
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

-- The bucket of a duration in seconds; a negative one (clocks) or NULL is bucket 0.
CREATE FUNCTION job_duration_bucket(seconds double precision) RETURNS smallint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT b.bucket FROM job_duration_buckets AS b
         WHERE b.lower_seconds <= greatest(coalesce(seconds, 0.0), 0.0)
         ORDER BY b.lower_seconds DESC LIMIT 1),
        0::smallint)
$$;

-- The dashboard's charts, as on SQLite: per kind, per minute (`width` 1) and
-- per ten minutes (`width` 10, `period` its start), jobs started by how long
-- they waited (`series` 'wait', from `run_at` to the start) and attempts
-- ended by how and after how long (`series` the status the job left
-- `running` for, 'retried' for the queue; a queued job cancelled is
-- 'cancelled' with `bucket` -1). As with job_counts, concurrent transactions
-- must not wait on each other for it (every claim and outcome of a kind in
-- one minute would update one row): a trigger appends each event to
-- job_history_changes, and job_history_fold() moves them into job_history,
-- one transaction at a time. The charts fold and then read both, in one
-- snapshot; the trigger folds once in a while too, so the changes stay few
-- when nobody looks. Rows older than the charts show are deleted by the
-- prune job.
CREATE TABLE job_history (
    width smallint NOT NULL CHECK (width IN (1, 10)),
    period timestamptz NOT NULL,
    kind text NOT NULL,
    series text NOT NULL,
    bucket smallint NOT NULL,
    count bigint NOT NULL CHECK (count >= 1),
    PRIMARY KEY (width, period, kind, series, bucket)
);

CREATE TABLE job_history_changes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    moment timestamptz NOT NULL,
    kind text NOT NULL,
    series text NOT NULL,
    bucket smallint NOT NULL
);

CREATE FUNCTION job_history_fold() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- One fold at a time; a transaction that finds another folding skips.
    -- (The key is this function's: 'mqhistry' as hex.)
    IF NOT pg_try_advisory_xact_lock(x'6d71686973747279'::bigint) THEN
        RETURN;
    END IF;
    WITH moved AS (
        DELETE FROM job_history_changes RETURNING moment, kind, series, bucket
    )
    INSERT INTO job_history AS h (width, period, kind, series, bucket, count)
    SELECT w.width,
        date_bin(make_interval(mins => w.width), m.moment, timestamptz '2000-01-01 00:00+00'),
        m.kind, m.series, m.bucket, count(*)
    FROM moved AS m CROSS JOIN (VALUES (1::smallint), (10::smallint)) AS w(width)
    GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (width, period, kind, series, bucket) DO UPDATE SET count = h.count + excluded.count;
END;
$$;

-- A duration that cannot be told (a time missing) is bucket 0, and a start
-- without its time counts at the row's update, so that no claim or outcome
-- can fail for the charts' sake.
CREATE FUNCTION job_history_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'queued' AND NEW.status = 'running' THEN
        INSERT INTO job_history_changes (moment, kind, series, bucket) VALUES (
            coalesce(NEW.started_at, NEW.updated_at), NEW.kind, 'wait',
            job_duration_bucket(extract(epoch FROM NEW.started_at - NEW.run_at)::float8));
    ELSIF OLD.status = 'running' THEN
        INSERT INTO job_history_changes (moment, kind, series, bucket) VALUES (
            NEW.updated_at, NEW.kind,
            CASE NEW.status WHEN 'queued' THEN 'retried' ELSE NEW.status END,
            job_duration_bucket(extract(epoch FROM NEW.updated_at - NEW.started_at)::float8));
    ELSIF OLD.status = 'queued' AND NEW.status = 'cancelled' THEN
        INSERT INTO job_history_changes (moment, kind, series, bucket)
        VALUES (NEW.updated_at, NEW.kind, 'cancelled', -1);
    END IF;
    IF random() < 0.0005 THEN
        PERFORM job_history_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_history_update AFTER UPDATE OF status ON jobs
FOR EACH ROW WHEN (
    OLD.status IS DISTINCT FROM NEW.status
    AND (OLD.status = 'running' OR NEW.status = 'running'
         OR (OLD.status = 'queued' AND NEW.status = 'cancelled'))
) EXECUTE FUNCTION job_history_note();

-- The history of the last day, from the jobs already in the table, so the
-- charts are not empty after the upgrade (through `jobs_finished`).
INSERT INTO job_history (width, period, kind, series, bucket, count)
SELECT w.width, date_bin(make_interval(mins => w.width), j.finished_at, timestamptz '2000-01-01 00:00+00'),
    j.kind, j.status,
    CASE WHEN j.started_at IS NULL THEN -1::smallint
        ELSE job_duration_bucket(extract(epoch FROM j.finished_at - j.started_at)::float8) END,
    count(*)
FROM jobs AS j CROSS JOIN (VALUES (1::smallint), (10::smallint)) AS w(width)
WHERE j.finished_at IS NOT NULL AND j.finished_at >= now() - interval '1 day'
GROUP BY 1, 2, 3, 4, 5;

INSERT INTO job_history (width, period, kind, series, bucket, count)
SELECT w.width, date_bin(make_interval(mins => w.width), j.started_at, timestamptz '2000-01-01 00:00+00'),
    j.kind, 'wait', job_duration_bucket(extract(epoch FROM j.started_at - j.run_at)::float8),
    count(*)
FROM jobs AS j CROSS JOIN (VALUES (1::smallint), (10::smallint)) AS w(width)
WHERE j.finished_at IS NOT NULL AND j.finished_at >= now() - interval '1 day'
AND j.started_at IS NOT NULL AND j.started_at >= now() - interval '1 day'
GROUP BY 1, 2, 3, 4, 5;
