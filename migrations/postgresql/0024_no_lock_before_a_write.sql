-- Rows locked only by the writes that change them: the version's trigger
-- after the row, not before it (as SQLite's is), and a household's queue
-- row updated before it is inserted.
--
-- pg_waldump over a 2,000-job drain (enqueued one at a time): 2.9 row locks
-- of `jobs` a job and one of `household_queues`, each a WAL record of its
-- own before the row's write, 213 of the 3,144 WAL bytes a job.
--
-- 0011's trigger ran BEFORE each row's update. Whatever its WHEN says, a
-- BEFORE row trigger makes the executor lock the row it is about to update
-- first (to hand the trigger the row as it is now): every UPDATE of `jobs`,
-- a claim's, an outcome's, a lease renewal's, locked each row before
-- writing it (the claim's own `FOR UPDATE SKIP LOCKED` is the one lock a job
-- needs). An AFTER row trigger reads the old row without locking it, and its
-- WHEN is tested as the row is written: the service's statements, which set
-- the version themselves, queue no event and call no function. Any other
-- write to the columns that show (the same list) still makes a new version,
-- by a second update of the row once the statement has written it.
CREATE FUNCTION jobs_version_catch_up() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET version = jobs.version + 1 WHERE seq = NEW.seq AND version = NEW.version;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_version_after AFTER UPDATE OF
    status, result, error, attempt, max_attempts, run_at, started_at, finished_at,
    priority, cancel_requested_at, kind, payload, household_id
ON jobs
FOR EACH ROW WHEN (NEW.version = OLD.version) EXECUTE FUNCTION jobs_version_catch_up();

DROP TRIGGER jobs_version ON jobs;
DROP FUNCTION jobs_version_bump();

-- 0023's function, the same row: an enqueue's `INSERT ... ON CONFLICT DO
-- UPDATE` locked the household's row (a WAL record) before updating it, and
-- looked up the household's last start for the insert it did not make. An
-- UPDATE writes the row it locks; the insert is made only for a household
-- with no row yet, and one that a concurrent enqueue inserted meanwhile is
-- updated instead.
CREATE OR REPLACE FUNCTION household_queue_join(
    household bigint, run_at timestamptz, seq bigint, joining bigint
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        UPDATE household_queues AS q
        SET head_run_at = CASE WHEN (household_queue_join.run_at, household_queue_join.seq)
                                    < (q.head_run_at, q.head_seq)
                               THEN household_queue_join.run_at ELSE q.head_run_at END,
            head_seq = CASE WHEN (household_queue_join.run_at, household_queue_join.seq)
                                 < (q.head_run_at, q.head_seq)
                            THEN household_queue_join.seq ELSE q.head_seq END,
            queued = q.queued + joining,
            -- Whatever held the household may not hold the jobs that joined.
            held_until = NULL
        WHERE q.household_id = household;
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO household_queues (household_id, served_at, head_run_at, head_seq, queued)
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
        ON CONFLICT (household_id) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END $$;
