-- Every list of a household's jobs walks that household's own rows only,
-- whatever its filter: with `kind`, through (household_id, kind, seq); with a
-- final status, through (household_id, status, seq) over finished jobs
-- only. Without them a household's `?kind=` list walked every household's
-- jobs of the kind (through `jobs_kind_seq`), and `?status=cancelled` its
-- whole history. The first takes an entry at each insert only (a job's
-- kind never changes); the second at each finish only (a claim moves a job
-- between statuses it does not hold), so neither is rewritten by a claim.
-- Queued and running jobs are found through `jobs_household_queued` and
-- `jobs_running`, which the quota keeps small per household.
CREATE INDEX jobs_household_kind ON jobs (household_id, kind, seq);
CREATE INDEX jobs_household_finished ON jobs (household_id, status, seq)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

-- With (household_id, kind, seq) SQLite reads a household's running jobs
-- through it, that is through the household's whole history: the queue
-- triggers' read of its latest start, at each enqueue, name the partial
-- index of running rows (their bodies otherwise as migration 0011 made them).
DROP TRIGGER jobs_queue_insert;
CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs WHEN NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq, queued)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs INDEXED BY jobs_running
         WHERE household_id = NEW.household_id AND status = 'running'),
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

DROP TRIGGER jobs_queue_enter;
CREATE TRIGGER jobs_queue_enter AFTER UPDATE OF status ON jobs
WHEN OLD.status <> 'queued' AND NEW.status = 'queued'
BEGIN
    INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq, queued)
    VALUES (
        NEW.household_id,
        (SELECT max(started_at) FROM jobs INDEXED BY jobs_running
         WHERE household_id = NEW.household_id AND status = 'running'),
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
