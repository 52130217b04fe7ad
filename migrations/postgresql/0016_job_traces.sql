-- The W3C `traceparent` of what enqueued a job, as SQLite's
-- 0020_job_traces.sql keeps it: written only while tracing is on, in a
-- table of its own so that with tracing off nothing pays for it, gone with
-- its job by the foreign key (a prune, a delete, an erasure).
CREATE TABLE job_traces (
    job_id text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    traceparent text NOT NULL CHECK (length(traceparent) <= 55)
);
