-- Fair claiming between households, and what it needs.
--
-- household_queues has one row per household with queued jobs: its head (the
-- oldest queued job: run_at, seq), served_at (when a claim last took one of
-- its jobs; -infinity: not since its queue was last empty with nothing
-- running) and served_jobs (how many jobs claims took from it since the row
-- was made). The claim takes households in turn: fewest running jobs first,
-- then the one served longest ago (of those one claim served, the one served
-- fewer jobs so far), then the oldest head. A household with nothing queued has no
-- row, so it costs the claim nothing. The triggers below keep the table
-- right whatever changes a job (enqueue, claim, retry, rescue, cancel,
-- delete), in the same transaction as the change.
--
-- Concurrency: a claim locks the rows of the households it takes from,
-- skipping rows another transaction holds (it never waits for one, so it
-- cannot deadlock with a transaction that holds one row and waits for
-- another); a trigger that finds a head again locks the row first and
-- reads the jobs after, in a statement of its own, so it sees every commit
-- made before it got the lock.
CREATE TABLE household_queues (
    household_id bigint PRIMARY KEY REFERENCES households (id) ON DELETE CASCADE,
    served_at timestamptz NOT NULL DEFAULT '-infinity',
    served_jobs integer NOT NULL DEFAULT 0,
    head_run_at timestamptz NOT NULL,
    head_seq bigint NOT NULL
);

-- The claim's walk over households with nothing running, in turn order.
CREATE INDEX household_queues_turn
ON household_queues (served_at, served_jobs, head_run_at, head_seq);

-- A household's queued jobs, oldest first: its head, and the jobs a claim takes from it.
CREATE INDEX jobs_household_queued ON jobs (household_id, run_at, seq) WHERE status = 'queued';

-- Running jobs by household and kind: the running counts the claim orders by
-- and the per-kind caps (only running rows, so finished ones cost nothing).
CREATE INDEX jobs_running ON jobs (household_id, kind) WHERE status = 'running';

INSERT INTO household_queues (household_id, head_run_at, head_seq)
SELECT DISTINCT ON (household_id) household_id, run_at, seq
FROM jobs WHERE status = 'queued'
ORDER BY household_id, run_at, seq;

-- A job joined the household's queue: it may be its new head. A household
-- whose queue was empty but which has jobs running counts as served when its
-- latest running job started: emptying the queue must not put it ahead of
-- households that waited.
CREATE FUNCTION household_queue_join(household bigint, run_at timestamptz, seq bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO household_queues AS q (household_id, served_at, head_run_at, head_seq)
    VALUES (
        household,
        coalesce(
            (SELECT max(j.started_at) FROM jobs AS j
             WHERE j.household_id = household AND j.status = 'running'),
            '-infinity'
        ),
        run_at,
        seq
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = excluded.head_run_at, head_seq = excluded.head_seq
    WHERE (excluded.head_run_at, excluded.head_seq) < (q.head_run_at, q.head_seq);
END $$;

-- A queued job left the household's queue or moved in it: find the head again
-- (one index probe), or drop the row when nothing is queued.
CREATE FUNCTION household_queue_refresh(household bigint, served timestamptz)
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
    INSERT INTO household_queues AS q (household_id, served_at, served_jobs, head_run_at, head_seq)
    VALUES (household, coalesce(served, '-infinity'), 0, head.run_at, head.seq)
    ON CONFLICT (household_id) DO UPDATE
    SET served_jobs = q.served_jobs + (served IS NOT NULL)::integer,
        served_at = coalesce(served, q.served_at),
        head_run_at = excluded.head_run_at, head_seq = excluded.head_seq;
END $$;

CREATE FUNCTION jobs_queue_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM household_queue_refresh(OLD.household_id, NULL);
    ELSIF TG_OP = 'INSERT' OR OLD.status <> 'queued' THEN
        PERFORM household_queue_join(NEW.household_id, NEW.run_at, NEW.seq);
    ELSE
        PERFORM household_queue_refresh(
            OLD.household_id, CASE WHEN NEW.status = 'running' THEN NEW.started_at END
        );
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs
FOR EACH ROW WHEN (NEW.status = 'queued') EXECUTE FUNCTION jobs_queue_changed();

CREATE TRIGGER jobs_queue_update AFTER UPDATE OF status, run_at ON jobs
FOR EACH ROW WHEN (
    (OLD.status <> 'queued' AND NEW.status = 'queued')
    OR (OLD.status = 'queued' AND (NEW.status <> 'queued' OR NEW.run_at <> OLD.run_at))
) EXECUTE FUNCTION jobs_queue_changed();

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs
FOR EACH ROW WHEN (OLD.status = 'queued') EXECUTE FUNCTION jobs_queue_changed();
