-- Fair claiming between households, and what it needs.
--
-- household_queues has one row per household with queued jobs: its head (the
-- oldest queued job: run_at, seq), served_at (when a claim last took one of
-- its jobs; NULL: not since its queue was last empty with nothing running)
-- and served_jobs (how many jobs claims took from it since the row was
-- made). The claim takes households in turn: fewest running jobs first, then
-- the one served longest ago (of those one claim served, the one served
-- fewer jobs so far), then the oldest head. A household with nothing queued has no
-- row, so it costs the claim nothing. The triggers below keep the table
-- right whatever changes a job (enqueue, claim, retry, rescue, cancel,
-- delete), in the same transaction as the change.
CREATE TABLE household_queues (
    household_id INTEGER PRIMARY KEY REFERENCES households (id) ON DELETE CASCADE,
    served_at TEXT,
    served_jobs INTEGER NOT NULL DEFAULT 0,
    -- NULL only inside a trigger, between a head leaving and the row going.
    head_run_at TEXT,
    head_seq INTEGER
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
SELECT household_id, run_at, seq FROM jobs AS j
WHERE status = 'queued' AND seq = (
    SELECT seq FROM jobs WHERE household_id = j.household_id AND status = 'queued'
    ORDER BY run_at, seq LIMIT 1
);

-- A job joins the queue (enqueued, retried, rescued): it may be the new head.
-- A household whose queue was empty but which has jobs running counts as
-- served when its latest running job started: emptying the queue must not
-- put it ahead of households that waited.
CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs WHEN NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs WHERE household_id = NEW.household_id AND status = 'running'),
        NEW.run_at,
        NEW.seq
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = excluded.head_run_at, head_seq = excluded.head_seq
    WHERE (excluded.head_run_at, excluded.head_seq) < (head_run_at, head_seq);
END;

CREATE TRIGGER jobs_queue_enter AFTER UPDATE OF status ON jobs
WHEN OLD.status <> 'queued' AND NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs WHERE household_id = NEW.household_id AND status = 'running'),
        NEW.run_at,
        NEW.seq
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = excluded.head_run_at, head_seq = excluded.head_seq
    WHERE (excluded.head_run_at, excluded.head_seq) < (head_run_at, head_seq);
END;

-- A queued job leaves the queue (claimed, cancelled) or moves in it: the head
-- is found again (one index probe); a claim marks the household served.
CREATE TRIGGER jobs_queue_leave AFTER UPDATE OF status, run_at ON jobs
WHEN OLD.status = 'queued' AND (NEW.status <> 'queued' OR NEW.run_at <> OLD.run_at)
BEGIN
    UPDATE household_queues
    SET served_jobs = served_jobs + (NEW.status = 'running'),
        served_at = CASE WHEN NEW.status = 'running' THEN NEW.started_at ELSE served_at END,
        (head_run_at, head_seq) = (
            SELECT run_at, seq FROM jobs
            WHERE household_id = OLD.household_id AND status = 'queued'
            ORDER BY run_at, seq LIMIT 1
        )
    WHERE household_id = OLD.household_id;
    DELETE FROM household_queues WHERE household_id = OLD.household_id AND head_seq IS NULL;
END;

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs WHEN OLD.status = 'queued'
BEGIN
    UPDATE household_queues
    SET (head_run_at, head_seq) = (
        SELECT run_at, seq FROM jobs
        WHERE household_id = OLD.household_id AND status = 'queued'
        ORDER BY run_at, seq LIMIT 1
    )
    WHERE household_id = OLD.household_id;
    DELETE FROM household_queues WHERE household_id = OLD.household_id AND head_seq IS NULL;
END;
