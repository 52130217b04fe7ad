-- The queue figures and the charts noted once per statement, not once per
-- row. The row triggers of 0004 and 0012 appended one job_count_changes row
-- for each status a job left or entered (five from its enqueue to its
-- success) and one job_history_changes row for each start and end: a claim
-- or a completer's batch of n jobs wrote 3n rows, each with its index entry,
-- each deleted again by the next fold. Read from the WAL of a 2,000-job
-- drain (pg_walinspect), those rows, their indexes and their deletes were
-- about 1,100 of the 4,400 WAL bytes a job cost. A statement trigger sees
-- the rows the statement changed (its transition tables) and writes one
-- count change per kind and status, with its sum, and one history change
-- per minute, kind, series and bucket, with how many.
--
-- Transition tables cannot go with a column list, so the update triggers
-- run for every UPDATE of jobs: their statements pair each row's old and
-- new version by seq and write nothing when no kind or status changed.

ALTER TABLE job_history_changes ADD COLUMN count integer NOT NULL DEFAULT 1 CHECK (count >= 1);

-- A change's moment is now its minute (the changes of a statement are
-- grouped by it): binned again to one or ten minutes, it lands where the
-- event's own time did.
CREATE OR REPLACE FUNCTION job_history_fold() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- One fold at a time; a transaction that finds another folding skips.
    -- (The key is this function's: 'mqhistry' as hex.)
    IF NOT pg_try_advisory_xact_lock(x'6d71686973747279'::bigint) THEN
        RETURN;
    END IF;
    WITH moved AS (
        DELETE FROM job_history_changes RETURNING moment, kind, series, bucket, count
    )
    INSERT INTO job_history AS h (width, period, kind, series, bucket, count)
    SELECT w.width,
        date_bin(make_interval(mins => w.width), m.moment, timestamptz '2000-01-01 00:00+00'),
        m.kind, m.series, m.bucket, sum(m.count)
    FROM moved AS m CROSS JOIN (VALUES (1::smallint), (10::smallint)) AS w(width)
    GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (width, period, kind, series, bucket) DO UPDATE SET count = h.count + excluded.count;
END;
$$;

DROP TRIGGER job_counts_insert_delete ON jobs;
DROP TRIGGER job_counts_update ON jobs;
DROP TRIGGER job_history_update ON jobs;
DROP FUNCTION job_counts_note();
DROP FUNCTION job_history_note();

-- Each branch names only the transition tables of the triggers that take it
-- (PL/pgSQL plans a statement when it first runs it).
CREATE FUNCTION job_counts_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_count_changes (kind, status, change)
        SELECT kind, status, count(*) FROM added_jobs GROUP BY kind, status;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO job_count_changes (kind, status, change)
        SELECT kind, status, -count(*) FROM removed_jobs GROUP BY kind, status;
    ELSE
        INSERT INTO job_count_changes (kind, status, change)
        SELECT moved.kind, moved.status, sum(moved.change)
        FROM old_jobs AS o
        JOIN new_jobs AS n ON n.seq = o.seq
        CROSS JOIN LATERAL (VALUES (o.kind, o.status, -1), (n.kind, n.status, 1))
            AS moved (kind, status, change)
        WHERE o.kind IS DISTINCT FROM n.kind OR o.status IS DISTINCT FROM n.status
        GROUP BY moved.kind, moved.status
        HAVING sum(moved.change) <> 0;
    END IF;
    IF random() < 0.0005 THEN
        PERFORM job_counts_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS added_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_note();

CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS removed_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_note();

CREATE TRIGGER job_counts_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_note();

-- As 0012's row trigger: a start is a 'wait' event at the start's time
-- (the update's, without one), bucketed by how long the job waited from its
-- due time; an attempt's end is an event of the status it went to
-- ('retried' for the queue) at the update's time, bucketed by how long it
-- ran; a queued job cancelled is 'cancelled' with bucket -1.
CREATE FUNCTION job_history_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_history_changes (moment, kind, series, bucket, count)
    SELECT date_bin(interval '1 minute', e.moment, timestamptz '2000-01-01 00:00+00'),
        e.kind, e.series, e.bucket, count(*)
    FROM old_jobs AS o
    JOIN new_jobs AS n ON n.seq = o.seq
    CROSS JOIN LATERAL (
        SELECT coalesce(n.started_at, n.updated_at) AS moment, n.kind, 'wait' AS series,
            job_duration_bucket(extract(epoch FROM n.started_at - n.run_at)::float8) AS bucket
        WHERE o.status = 'queued' AND n.status = 'running'
        UNION ALL
        SELECT n.updated_at, n.kind,
            CASE n.status WHEN 'queued' THEN 'retried' ELSE n.status END,
            job_duration_bucket(extract(epoch FROM n.updated_at - n.started_at)::float8)
        WHERE o.status = 'running' AND n.status <> 'running'
        UNION ALL
        SELECT n.updated_at, n.kind, 'cancelled', -1::smallint
        WHERE o.status = 'queued' AND n.status = 'cancelled'
    ) AS e
    WHERE o.status IS DISTINCT FROM n.status
    GROUP BY 1, 2, 3, 4;
    IF random() < 0.0005 THEN
        PERFORM job_history_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_history_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_history_note();
