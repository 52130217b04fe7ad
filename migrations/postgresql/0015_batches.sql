-- Dependencies and batches, as SQLite's 0019_batches.sql keeps them: a job
-- that depends on others waits queued at 9999-01-01 (`WAITING_RUN_AT`)
-- while its `job_dependencies` rows last; the runner's unblocker deletes a
-- row once its job is final, then makes the job due or cancels it.
CREATE TABLE job_dependencies (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    depends_on text NOT NULL,
    needs_success boolean NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependencies_on ON job_dependencies (depends_on);

CREATE TABLE batches (
    id text PRIMARY KEY CHECK (char_length(id) = 32),
    household_id bigint NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    total integer NOT NULL CHECK (total >= 1),
    callback_job_id text UNIQUE REFERENCES jobs (id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX batches_household ON batches (household_id, created_at);
CREATE TABLE batch_jobs (
    batch_id text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position integer NOT NULL CHECK (position >= 0),
    job_id text NOT NULL UNIQUE REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (batch_id, position)
);

-- A job cancelled because one it depends on did not succeed says so in its
-- error. The new check is looser than the one it replaces, which every row
-- met: NOT VALID spares the table's scan under its lock.
ALTER TABLE jobs DROP CONSTRAINT jobs_check3;
ALTER TABLE jobs ADD CONSTRAINT jobs_error_check CHECK (
    CASE status WHEN 'failed' THEN error IS NOT NULL
    WHEN 'cancelled' THEN true ELSE error IS NULL END
) NOT VALID;
