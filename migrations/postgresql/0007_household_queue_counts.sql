-- Each household's queued jobs, counted on its queue row, as SQLite's
-- 0011_household_queue_counts.sql does. The household's quota reads its use
-- from here in one probe (plus its running jobs, at most the deployment's
-- workers) instead of walking its queued jobs: up to the quota per enqueue,
-- thousands for a household allowed that many. The functions are those of
-- 0005_fair_claims.sql, each keeping the count in the statement it already
-- runs on the household's row (which it holds locked until its transaction
-- ends, so concurrent changes of one household's count take turns). The
-- count is not in an index: changing it alone leaves the row's index
-- entries as they are.
--
-- Migrations run while the old code serves. The jobs table is locked first,
-- so that every write to it in flight commits before the count is taken
-- and none starts until the new functions are in place: a write whose
-- trigger waited on the ALTER below would otherwise go on in the old
-- function, which does not count. (A claim that already holds its
-- household_queues lock and waits for this one is a deadlock PostgreSQL
-- breaks by failing one of the two; either can simply be run again.)
--
-- A count never goes below zero, and a household's row, with its count, is
-- dropped whenever its queue empties: a count that drifted (which nothing
-- here should let happen) errs the quota by that much until then, and never
-- stops a claim.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE household_queues ADD COLUMN queued integer NOT NULL DEFAULT 0;

UPDATE household_queues AS q SET queued = (
    SELECT count(*) FROM jobs AS j WHERE j.household_id = q.household_id AND j.status = 'queued'
);

-- A job joined the household's queue: counted, and it may be its new head.
-- A household whose queue was empty but which has jobs running counts as
-- served when its latest running job started: emptying the queue must not
-- put it ahead of households that waited.
CREATE OR REPLACE FUNCTION household_queue_join(household bigint, run_at timestamptz, seq bigint)
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
        1
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = CASE WHEN (excluded.head_run_at, excluded.head_seq)
                                < (q.head_run_at, q.head_seq)
                           THEN excluded.head_run_at ELSE q.head_run_at END,
        head_seq = CASE WHEN (excluded.head_run_at, excluded.head_seq)
                             < (q.head_run_at, q.head_seq)
                        THEN excluded.head_seq ELSE q.head_seq END,
        queued = q.queued + 1;
END $$;

-- A queued job left the household's queue (`leaving` 1) or moved in it (0):
-- counted out if it left, and the head found again (one index probe), or the
-- row dropped when nothing is queued.
CREATE FUNCTION household_queue_refresh(household bigint, served timestamptz, leaving integer)
RETURNS void LANGUAGE plpgsql AS $$
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
    SET served_jobs = q.served_jobs + (served IS NOT NULL)::integer,
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
        SET served_jobs = q.served_jobs + (served IS NOT NULL)::integer,
            served_at = coalesce(served, q.served_at),
            head_run_at = excluded.head_run_at, head_seq = excluded.head_seq,
            queued = greatest(q.queued - leaving, 0);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION jobs_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM household_queue_refresh(OLD.household_id, NULL, 1);
    ELSIF TG_OP = 'INSERT' OR OLD.status <> 'queued' THEN
        PERFORM household_queue_join(NEW.household_id, NEW.run_at, NEW.seq);
    ELSE
        PERFORM household_queue_refresh(
            OLD.household_id,
            CASE WHEN NEW.status = 'running' THEN NEW.started_at END,
            (NEW.status <> 'queued')::integer
        );
    END IF;
    RETURN NULL;
END $$;

-- The two-argument form, which nothing calls now.
DROP FUNCTION household_queue_refresh(bigint, timestamptz);
