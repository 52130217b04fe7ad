-- The W3C `traceparent` of what enqueued a job (a request's span, or the
-- attempt of the job that enqueued it), written only while tracing is on:
-- each attempt's span continues that trace. A table of its own rather than
-- a column of `jobs`, so that with tracing off (the default) no insert, no
-- claim and no row of the queue pays for it. Gone with its job by the
-- foreign key (a prune, a delete, an erasure).
CREATE TABLE job_traces (
    job_id TEXT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    traceparent TEXT NOT NULL CHECK (length(traceparent) <= 55)
) WITHOUT ROWID;
