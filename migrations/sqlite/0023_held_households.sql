-- Households held by their partitions. A household whose every due job
-- waits on a partition at its limit (a recipe host at its two running
-- imports) has nothing any claim could take, yet a claim walking the
-- households in turn read each of its jobs to learn that, at every claim:
-- with 20,000 such jobs in 1,000 households a claim took 11 ms instead of
-- 0.7. A sweep (at most once per `mealquest.db.claiming.HOLD_SECONDS`)
-- marks such households held until a moment (`held_until`), under the
-- generation of the holds it made them in (`held_generation`), and keeps
-- the partitions it found at a limit (`held_partitions`); claims pass over a
-- household held now without reading its jobs. A hold ends sooner when a
-- job joins the household's queue (the triggers below clear it), or when a
-- job of one of those partitions stops running and so may free it (the
-- trigger below starts a new generation, which ends every hold).
ALTER TABLE household_queues ADD COLUMN held_until TEXT;
ALTER TABLE household_queues ADD COLUMN held_generation INTEGER;

CREATE TABLE household_holds (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    swept_at TEXT NOT NULL
);
INSERT INTO household_holds (id, generation, swept_at)
VALUES (1, 0, '1970-01-01T00:00:00.000000Z');

CREATE TABLE held_partitions (
    kind TEXT NOT NULL,
    partition_key TEXT NOT NULL,
    PRIMARY KEY (kind, partition_key)
) WITHOUT ROWID;

-- A job joins the queue: whatever held its household may not hold this job.
CREATE TRIGGER jobs_queue_insert_unholds AFTER INSERT ON jobs WHEN NEW.status = 'queued'
BEGIN
    UPDATE household_queues SET held_until = NULL
    WHERE household_id = NEW.household_id AND held_until IS NOT NULL;
END;

CREATE TRIGGER jobs_queue_enter_unholds AFTER UPDATE OF status ON jobs
WHEN OLD.status <> 'queued' AND NEW.status = 'queued'
BEGIN
    UPDATE household_queues SET held_until = NULL
    WHERE household_id = NEW.household_id AND held_until IS NOT NULL;
END;

-- A job of a partition the sweep found at a limit stops running: the
-- partition may have room now (one probe of `held_partitions`).
CREATE TRIGGER jobs_partition_frees AFTER UPDATE OF status ON jobs
WHEN OLD.status = 'running' AND NEW.status <> 'running' AND OLD.partition_key IS NOT NULL
BEGIN
    UPDATE household_holds SET generation = generation + 1
    WHERE id = 1 AND EXISTS (
        SELECT 1 FROM held_partitions
        WHERE kind = OLD.kind AND partition_key = OLD.partition_key
    );
END;
