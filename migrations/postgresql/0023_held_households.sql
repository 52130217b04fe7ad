-- Households held: nothing of theirs any claim could take. A household
-- whose every due job is of a paused kind, of a kind at its deployment-wide
-- cap, or waits on a partition at its limit (a recipe host at its two
-- running imports), or a suspended household, has nothing a claim could
-- take, yet a claim walking the households in turn read each of its jobs
-- to learn that, at every claim. A sweep (at most once per
-- `mealquest.db.claiming.HOLD_SECONDS`) marks such households held until a
-- moment (`held_until`), under the generation of the holds it made them in
-- (`held_generation`), and keeps the kinds and the partitions it found full
-- (`held_kinds`, `held_partitions`); claims pass over a household held now
-- without reading its jobs. A hold ends sooner when a job joins the
-- household's queue (`household_queue_join` clears it) or the household is
-- lifted from suspension, or when a job of a kept kind or partition stops
-- running (so may free it) or a kind is resumed (a new generation, which
-- ends every hold).
ALTER TABLE household_queues ADD COLUMN held_until timestamptz;
ALTER TABLE household_queues ADD COLUMN held_generation bigint;

CREATE TABLE household_holds (
    id integer PRIMARY KEY CHECK (id = 1),
    generation bigint NOT NULL,
    swept_at timestamptz NOT NULL
);
INSERT INTO household_holds (id, generation, swept_at) VALUES (1, 0, '1970-01-01 00:00:00+00');

CREATE TABLE held_kinds (kind text PRIMARY KEY);

CREATE TABLE held_partitions (
    kind text NOT NULL,
    partition_key text NOT NULL,
    PRIMARY KEY (kind, partition_key)
);

CREATE OR REPLACE FUNCTION household_queue_join(
    household bigint, run_at timestamptz, seq bigint, joining bigint
) RETURNS void LANGUAGE plpgsql AS $$
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
        queued = q.queued + excluded.queued,
        -- Whatever held the household may not hold the jobs that joined.
        held_until = NULL;
END $$;

-- 0018's function, and: a job of a kind or a partition the last sweep
-- found full stopped running, so it may have room now.
CREATE OR REPLACE FUNCTION jobs_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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
        -- One row, updated only when a stopped job's kind or partition is
        -- kept: never a write (nor a lock) on the drain's path otherwise.
        IF (EXISTS (SELECT 1 FROM held_kinds) OR EXISTS (SELECT 1 FROM held_partitions))
            AND EXISTS (
                SELECT 1 FROM old_jobs AS o JOIN new_jobs AS n ON n.seq = o.seq
                WHERE o.status = 'running' AND n.status <> 'running'
                AND (o.kind IN (SELECT kind FROM held_kinds)
                     OR (o.kind, o.partition_key) IN (
                         SELECT kind, partition_key FROM held_partitions))
            )
        THEN
            UPDATE household_holds SET generation = generation + 1 WHERE id = 1;
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- A kind resumed: its jobs may be taken again.
CREATE FUNCTION paused_kinds_resumed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE household_holds SET generation = generation + 1 WHERE id = 1;
    RETURN NULL;
END $$;

CREATE TRIGGER paused_kinds_resume_unholds AFTER DELETE ON paused_kinds
    FOR EACH STATEMENT EXECUTE FUNCTION paused_kinds_resumed();

-- A household lifted from suspension: its jobs may be taken again.
CREATE FUNCTION households_lifted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE household_queues SET held_until = NULL WHERE household_id = NEW.id;
    RETURN NULL;
END $$;

CREATE TRIGGER households_lift_unholds AFTER UPDATE OF suspended_at ON households
    FOR EACH ROW WHEN (OLD.suspended_at IS NOT NULL AND NEW.suspended_at IS NULL)
    EXECUTE FUNCTION households_lifted();
