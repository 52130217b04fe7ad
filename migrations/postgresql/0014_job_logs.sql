-- A job's own log lines (`ctx.log` in its handler), as SQLite's
-- 0018_job_logs.sql keeps them: with the attempt that wrote them, at most 100
-- lines and 16 KiB an attempt, masked, shown to operators only, and gone with
-- their job by the foreign key (a prune, a delete, an erasure).
CREATE TABLE job_logs (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    line integer NOT NULL,
    level text NOT NULL,
    message text NOT NULL,
    logged_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, attempt, line)
);
