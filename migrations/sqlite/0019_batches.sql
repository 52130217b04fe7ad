-- Dependencies and batches (`depends_on`, `enqueue_batch`).
--
-- A job that depends on others is stored queued with `run_at` at
-- 9999-01-01 (`WAITING_RUN_AT`): no claim takes it, and it is nobody's
-- head of queue while a due job waits. Its `job_dependencies` rows name what
-- it waits for; the runner's unblocker (not the completer: off the hot path)
-- deletes a row once its job is final, then makes the job due when none is
-- left, or cancels it when one it needed did not succeed. `depends_on` has
-- no foreign key: a job that is gone (erased) cancels the job waiting for it.
CREATE TABLE job_dependencies (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    depends_on TEXT NOT NULL,
    -- 1: the job runs only if this one succeeded; 0: whatever its outcome
    -- (a batch's callback).
    needs_success INTEGER NOT NULL CHECK (needs_success IN (0, 1)),
    PRIMARY KEY (job_id, depends_on)
) WITHOUT ROWID;
CREATE INDEX job_dependencies_on ON job_dependencies (depends_on);

-- A household's batch: its members in their order, and the job that runs
-- once every member is final (its callback, which depends on them all).
CREATE TABLE batches (
    id TEXT PRIMARY KEY CHECK (length(id) = 32),
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    total INTEGER NOT NULL CHECK (total >= 1),
    callback_job_id TEXT UNIQUE REFERENCES jobs (id) ON DELETE SET NULL,
    created_at TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX batches_household ON batches (household_id, created_at);
CREATE TABLE batch_jobs (
    batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position INTEGER NOT NULL CHECK (position >= 0),
    job_id TEXT NOT NULL UNIQUE REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (batch_id, position)
) WITHOUT ROWID;

-- A job cancelled because one it depends on did not succeed says so in its
-- error, which only a failed job could hold until now. SQLite cannot alter
-- a CHECK; its documented way for a constraint that only gets looser (every
-- row already meets the new one, nothing on disk changes) is to edit the
-- table's stored SQL. The tables created above change the schema's cookie,
-- so every other connection reads the new definition.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(
    sql,
    'CHECK ((status = ''failed'') = (error IS NOT NULL))',
    'CHECK (CASE status WHEN ''failed'' THEN error IS NOT NULL '
    || 'WHEN ''cancelled'' THEN 1 ELSE error IS NULL END)'
)
WHERE type = 'table' AND name = 'jobs';
PRAGMA writable_schema = OFF;
