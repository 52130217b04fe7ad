-- The households' queue rows kept once per statement, not once per row.
-- 0005's row trigger locked and updated a household's queue row for each
-- job that joined or left its queue: a claim of n jobs of one household
-- locked and rewrote that row n times (each a WAL record, and each a new
-- row version with its index entries where the update was not HOT). A
-- statement trigger sees the rows the statement changed and, for each
-- household, joins its jobs at once (counted, the earliest its head
-- candidate) and refreshes the row once (served by as many jobs as
-- started, counted out by as many as left, its head found again).
-- Households are taken in ascending id, so two statements lock their
-- queue rows in one order.

CREATE FUNCTION household_queue_join(household bigint, run_at timestamptz, seq bigint, joining bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO household_queues AS q (household_id, served_at, head_run_at, head_seq, queued)
    VALUES (
        household,
        coalesce(
            (SELECT max(j.started_at) FROM jobs AS j
             WHERE j.household_id = household AND j.status = 'running'),
            '-infinity'
        ),
        run_at,
        seq,
        joining
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = CASE WHEN (excluded.head_run_at, excluded.head_seq)
                                < (q.head_run_at, q.head_seq)
                           THEN excluded.head_run_at ELSE q.head_run_at END,
        head_seq = CASE WHEN (excluded.head_run_at, excluded.head_seq)
                             < (q.head_run_at, q.head_seq)
                        THEN excluded.head_seq ELSE q.head_seq END,
        queued = q.queued + excluded.queued;
END $$;

CREATE FUNCTION household_queue_refresh(
    household bigint, served timestamptz, starting bigint, leaving bigint
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    head record;
BEGIN
    PERFORM 1 FROM household_queues WHERE household_id = household FOR UPDATE;
    SELECT j.run_at, j.seq INTO head FROM jobs AS j
    WHERE j.household_id = household AND j.status = 'queued'
    ORDER BY j.run_at, j.seq LIMIT 1;
    IF NOT FOUND THEN
        DELETE FROM household_queues WHERE household_id = household;
        RETURN;
    END IF;
    UPDATE household_queues AS q
    SET served_jobs = q.served_jobs + starting,
        served_at = coalesce(served, q.served_at),
        head_run_at = head.run_at, head_seq = head.seq,
        queued = greatest(q.queued - leaving, 0)
    WHERE q.household_id = household;
    IF NOT FOUND THEN
        -- No row for a household with queued jobs: made afresh, counted once.
        INSERT INTO household_queues AS q
            (household_id, served_at, served_jobs, head_run_at, head_seq, queued)
        SELECT household, coalesce(served, '-infinity'), 0, head.run_at, head.seq, count(*)
        FROM jobs AS j WHERE j.household_id = household AND j.status = 'queued'
        ON CONFLICT (household_id) DO UPDATE
        SET served_jobs = q.served_jobs + starting,
            served_at = coalesce(served, q.served_at),
            head_run_at = excluded.head_run_at, head_seq = excluded.head_seq,
            queued = greatest(q.queued - leaving, 0);
    END IF;
END $$;

DROP TRIGGER jobs_queue_insert ON jobs;
DROP TRIGGER jobs_queue_update ON jobs;
DROP TRIGGER jobs_queue_delete ON jobs;
DROP FUNCTION jobs_queue_changed();
DROP FUNCTION household_queue_join(bigint, timestamptz, bigint);
DROP FUNCTION household_queue_refresh(bigint, timestamptz, integer);

-- Per household of the statement's rows: the jobs that joined its queue
-- (inserted queued, or moved to `queued` from another status) and the
-- earliest of them; the jobs that left it or moved in it (a queued job
-- whose due time changed), how many left and how many of those started.
-- Each branch names only the transition tables of the triggers that take it
-- (PL/pgSQL plans a statement when it first runs it).
CREATE FUNCTION jobs_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    IF TG_OP = 'INSERT' THEN
        FOR h IN
            SELECT DISTINCT ON (household_id) household_id, run_at, seq,
                count(*) OVER (PARTITION BY household_id) AS joining
            FROM added_jobs WHERE status = 'queued'
            ORDER BY household_id, run_at, seq
        LOOP
            PERFORM household_queue_join(h.household_id, h.run_at, h.seq, h.joining);
        END LOOP;
    ELSIF TG_OP = 'DELETE' THEN
        FOR h IN
            SELECT household_id, count(*) AS leaving FROM removed_jobs
            WHERE status = 'queued' GROUP BY household_id ORDER BY household_id
        LOOP
            PERFORM household_queue_refresh(h.household_id, NULL, 0, h.leaving);
        END LOOP;
    ELSE
        FOR h IN
            WITH moved AS (
                SELECT o.household_id, n.run_at, n.seq, n.started_at,
                    o.status AS was, n.status AS now_is
                FROM old_jobs AS o JOIN new_jobs AS n ON n.seq = o.seq
                WHERE (o.status <> 'queued' AND n.status = 'queued')
                    OR (o.status = 'queued' AND (n.status <> 'queued' OR n.run_at <> o.run_at))
            ), joined AS (
                SELECT DISTINCT ON (household_id) household_id, run_at, seq,
                    count(*) OVER (PARTITION BY household_id) AS joining
                FROM moved WHERE was <> 'queued'
                ORDER BY household_id, run_at, seq
            ), left_or_moved AS (
                SELECT household_id,
                    max(started_at) FILTER (WHERE now_is = 'running') AS served,
                    count(*) FILTER (WHERE now_is = 'running') AS served_jobs,
                    count(*) FILTER (WHERE now_is <> 'queued') AS leaving
                FROM moved WHERE was = 'queued' GROUP BY household_id
            )
            SELECT household_id, j.run_at, j.seq, j.joining,
                l.served, l.served_jobs, l.leaving
            FROM joined AS j FULL JOIN left_or_moved AS l USING (household_id)
            ORDER BY household_id
        LOOP
            IF h.joining IS NOT NULL THEN
                PERFORM household_queue_join(h.household_id, h.run_at, h.seq, h.joining);
            END IF;
            IF h.leaving IS NOT NULL THEN
                PERFORM household_queue_refresh(
                    h.household_id, h.served, h.served_jobs, h.leaving);
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS added_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_queue_changed();

CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_queue_changed();

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS removed_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_queue_changed();
