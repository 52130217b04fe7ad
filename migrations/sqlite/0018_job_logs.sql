-- A job's own log lines (`ctx.log` in its handler), kept with the attempt
-- that wrote them: at most 100 lines and 16 KiB an attempt (the runner
-- bounds them), masked before they are stored, shown to operators only (the
-- dashboard's job page, `flask jobs show`), never in the households' API.
-- They go with their job, by the foreign key: a prune, a delete, an erasure.
CREATE TABLE job_logs (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    line INTEGER NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    logged_at TEXT NOT NULL,
    PRIMARY KEY (job_id, attempt, line)
) WITHOUT ROWID;
