-- Households held: nothing of theirs any claim could take. A household
-- whose every due job is of a paused kind, of a kind at its deployment-wide
-- cap, or waits on a partition at its limit (a recipe host at its two
-- running imports), or a suspended household, has nothing a claim could
-- take, yet a claim walking the households in turn read each of its jobs
-- to learn that, at every claim: with 20,000 such jobs in 1,000 households
-- a claim took 11 ms instead of 0.7. A sweep (at most once per
-- `mealquest.db.claiming.HOLD_SECONDS`) marks such households held until a
-- moment (`held_until`), under the generation of the holds it made them in
-- (`held_generation`), and keeps the kinds and the partitions it found full
-- (`held_kinds`, `held_partitions`); claims pass over a household held now
-- without reading its jobs. A hold ends sooner when a job joins the
-- household's queue or the household is lifted from suspension (the
-- triggers below clear it), or when a job of a kept kind or partition stops
-- running (so may free it) or a kind is resumed (the triggers below start a
-- new generation, which ends every hold).
ALTER TABLE household_queues ADD COLUMN held_until TEXT;
ALTER TABLE household_queues ADD COLUMN held_generation INTEGER;

CREATE TABLE household_holds (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    swept_at TEXT NOT NULL
);
INSERT INTO household_holds (id, generation, swept_at)
VALUES (1, 0, '1970-01-01T00:00:00.000000Z');

CREATE TABLE held_kinds (kind TEXT PRIMARY KEY) WITHOUT ROWID;

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

-- A job of a kind or a partition the sweep found full stops running: it
-- may have room now (a probe of `held_kinds`, one of `held_partitions`).
CREATE TRIGGER jobs_hold_frees AFTER UPDATE OF status ON jobs
WHEN OLD.status = 'running' AND NEW.status <> 'running'
BEGIN
    UPDATE household_holds SET generation = generation + 1
    WHERE id = 1 AND (
        EXISTS (SELECT 1 FROM held_kinds WHERE kind = OLD.kind)
        OR (OLD.partition_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM held_partitions
            WHERE kind = OLD.kind AND partition_key = OLD.partition_key
        ))
    );
END;

-- A kind resumed: its jobs may be taken again.
CREATE TRIGGER paused_kinds_resume_unholds AFTER DELETE ON paused_kinds
BEGIN
    UPDATE household_holds SET generation = generation + 1 WHERE id = 1;
END;

-- A household lifted from suspension: its jobs may be taken again.
CREATE TRIGGER households_lift_unholds AFTER UPDATE OF suspended_at ON households
WHEN OLD.suspended_at IS NOT NULL AND NEW.suspended_at IS NULL
BEGIN
    UPDATE household_queues SET held_until = NULL WHERE household_id = NEW.id;
END;
