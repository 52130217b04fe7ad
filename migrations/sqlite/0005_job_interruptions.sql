-- What an interruption does to a job, and how many it has had in a row.
--
-- An interruption is a graceful stop that cut the job short (a deploy, a
-- SIGHUP, a worker recycled after max_requests) or the death of the process
-- running it (its lease expired and a rescuer took it back). The policy is
-- stored on the row, like max_attempts, because the process that rescues a
-- job may not have a handler for its kind:
--   'requeue' puts it back in the queue with its attempt refunded (the job
--             did not fail; the machine or the operator stopped it) and fails
--             it 'interrupted by restart' at the 3rd interruption in a row,
--             so a job that kills its process stops coming back;
--   'fail'    fails it 'interrupted by restart' at once (at most once).
-- Existing rows take the default a kind gets: 'requeue' when it allows more
-- than one attempt (its author said a re-run is safe), else 'fail'.
-- interruptions resets when an attempt ends any other way.
ALTER TABLE jobs ADD COLUMN on_interrupt TEXT NOT NULL DEFAULT 'fail'
    CHECK (on_interrupt IN ('requeue', 'fail'));

ALTER TABLE jobs ADD COLUMN interruptions INTEGER NOT NULL DEFAULT 0
    CHECK (interruptions >= 0);

UPDATE jobs SET on_interrupt = 'requeue' WHERE max_attempts > 1;
