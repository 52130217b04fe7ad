-- Each household's queued jobs, counted on its queue row. The household's
-- quota reads its use from here in one probe (plus its running jobs, at most
-- the deployment's workers) instead of walking its queued jobs: up to the
-- quota per enqueue, thousands for a household allowed that many. The
-- triggers are those of 0009_fair_claims.sql, each keeping the count in the
-- statement it already runs on the household's row, so the count costs no
-- statement and no page of its own.
ALTER TABLE household_queues ADD COLUMN queued INTEGER NOT NULL DEFAULT 0 CHECK (queued >= 0);

UPDATE household_queues SET queued = (
    SELECT count(*) FROM jobs
    WHERE jobs.household_id = household_queues.household_id AND jobs.status = 'queued'
);

DROP TRIGGER jobs_queue_insert;
DROP TRIGGER jobs_queue_enter;
DROP TRIGGER jobs_queue_leave;
DROP TRIGGER jobs_queue_delete;

-- A job joins the queue (enqueued, retried, rescued): counted, and it may be
-- the new head. A household whose queue was empty but which has jobs
-- running counts as served when its latest running job started: emptying
-- the queue must not put it ahead of households that waited.
CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs WHEN NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq, queued)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs WHERE household_id = NEW.household_id AND status = 'running'),
        NEW.run_at,
        NEW.seq,
        0
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = excluded.head_run_at, head_seq = excluded.head_seq
    WHERE (excluded.head_run_at, excluded.head_seq) < (head_run_at, head_seq);
    -- Apart: setting the head's columns rewrites their index entry even
    -- when they keep their values, a page of WAL per enqueue.
    UPDATE household_queues SET queued = queued + 1 WHERE household_id = NEW.household_id;
END;

CREATE TRIGGER jobs_queue_enter AFTER UPDATE OF status ON jobs
WHEN OLD.status <> 'queued' AND NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq, queued)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs WHERE household_id = NEW.household_id AND status = 'running'),
        NEW.run_at,
        NEW.seq,
        0
    )
    ON CONFLICT (household_id) DO UPDATE
    SET head_run_at = excluded.head_run_at, head_seq = excluded.head_seq
    WHERE (excluded.head_run_at, excluded.head_seq) < (head_run_at, head_seq);
    -- Apart: setting the head's columns rewrites their index entry even
    -- when they keep their values, a page of WAL per enqueue.
    UPDATE household_queues SET queued = queued + 1 WHERE household_id = NEW.household_id;
END;

-- A queued job leaves the queue (claimed, cancelled) or moves in it: counted
-- out if it left, and the head is found again (one index probe); a claim
-- marks the household served.
CREATE TRIGGER jobs_queue_leave AFTER UPDATE OF status, run_at ON jobs
WHEN OLD.status = 'queued' AND (NEW.status <> 'queued' OR NEW.run_at <> OLD.run_at)
BEGIN
    UPDATE household_queues
    SET served_jobs = served_jobs + (NEW.status = 'running'),
        served_at = CASE WHEN NEW.status = 'running' THEN NEW.started_at ELSE served_at END,
        queued = queued - (NEW.status <> 'queued'),
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
    SET queued = queued - 1,
        (head_run_at, head_seq) = (
            SELECT run_at, seq FROM jobs
            WHERE household_id = OLD.household_id AND status = 'queued'
            ORDER BY run_at, seq LIMIT 1
        )
    WHERE household_id = OLD.household_id;
    DELETE FROM household_queues WHERE household_id = OLD.household_id AND head_seq IS NULL;
END;
