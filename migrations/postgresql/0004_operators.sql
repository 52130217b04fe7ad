-- Operators: the people who watch and steer the queue (the dashboard at
-- /admin/ and GET /metrics). They are not households: a table of their own,
-- so a household's token can never be an operator's, nor the reverse. Each
-- operator has one token, stored only as the hex SHA-256 digest of its text
-- (the clear token is shown once, when the operator is created); revoking
-- the operator revokes the token.
CREATE TABLE operators (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    token_sha256 text NOT NULL UNIQUE CHECK (char_length(token_sha256) = 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- The operator's views of the queue, across households, newest first. By
-- kind: a kind never changes, so this index costs an insert nothing more.
-- By status: failed and cancelled jobs have indexes of their own, written
-- only when a job ends that way; queued and running jobs are read through
-- the claim's and the rescuer's partial indexes, and succeeded ones, most of
-- the table, by walking it newest first. (An index on status would cost
-- every state change of every job another write.)
CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
CREATE INDEX jobs_failed_seq ON jobs (seq) WHERE status = 'failed';
CREATE INDEX jobs_cancelled_seq ON jobs (seq) WHERE status = 'cancelled';

-- Throughput: jobs finished in the last hour.
CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;

-- The oldest due job of each kind: queued jobs only, so it stays small.
CREATE INDEX jobs_due_by_kind ON jobs (kind, run_at) WHERE status = 'queued';

-- Jobs by kind and status for the operators' figures (GET /metrics, the
-- dashboard), without counting the table: a count of a million rows costs
-- about a second of the server's time, and every host's processes ask every
-- second or two while anyone watches. A trigger notes each change of a job's
-- kind or status as a row of job_count_changes (appended, never updated, so
-- concurrent transactions never wait on each other for it); job_counts holds
-- the sums of the changes folded so far. The figures are job_counts plus the
-- changes not yet folded, read in one statement (one snapshot: a fold moves
-- changes into job_counts atomically). job_counts_fold() folds them, one
-- transaction at a time (others skip it); readers call it, and so does, once
-- in a while, the trigger itself, so the changes stay few even when nobody
-- reads.
CREATE TABLE job_counts (
    kind text NOT NULL,
    status text NOT NULL,
    count bigint NOT NULL,
    PRIMARY KEY (kind, status)
);

CREATE TABLE job_count_changes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    status text NOT NULL,
    change integer NOT NULL
);

INSERT INTO job_counts (kind, status, count)
SELECT kind, status, count(*) FROM jobs GROUP BY kind, status;

CREATE FUNCTION job_counts_fold() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- One fold at a time; a transaction that finds another folding skips.
    -- (The key is this function's: 'mqcounts' as hex.)
    IF NOT pg_try_advisory_xact_lock(x'6d71636f756e7473'::bigint) THEN
        RETURN;
    END IF;
    WITH moved AS (
        DELETE FROM job_count_changes RETURNING kind, status, change
    ), summed AS (
        SELECT kind, status, sum(change) AS change FROM moved GROUP BY kind, status
    )
    INSERT INTO job_counts (kind, status, count)
    SELECT kind, status, change FROM summed
    ON CONFLICT (kind, status) DO UPDATE SET count = job_counts.count + excluded.count;
END;
$$;

CREATE FUNCTION job_counts_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO job_count_changes (kind, status, change) VALUES (OLD.kind, OLD.status, -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO job_count_changes (kind, status, change) VALUES (NEW.kind, NEW.status, 1);
    END IF;
    IF random() < 0.0005 THEN
        PERFORM job_counts_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_counts_insert_delete AFTER INSERT OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_counts_note();

CREATE TRIGGER job_counts_update AFTER UPDATE OF kind, status ON jobs
    FOR EACH ROW WHEN (OLD.kind IS DISTINCT FROM NEW.kind OR OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION job_counts_note();
