-- Operators: the people who watch and steer the queue (the dashboard at
-- /admin/ and GET /metrics). They are not households: a table of their own,
-- so a household's token can never be an operator's, nor the reverse. Each
-- operator has one token, stored only as the hex SHA-256 digest of its text
-- (the clear token is shown once, when the operator is created); revoking
-- the operator revokes the token.
CREATE TABLE operators (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    token_sha256 TEXT NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    created_at TEXT NOT NULL,
    revoked_at TEXT
);

-- The operator's views of the queue, across households, newest first: by
-- status, by kind, and by both (the last also counts jobs by status and kind
-- from the index alone).
CREATE INDEX jobs_status_seq ON jobs (status, seq);
CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
CREATE INDEX jobs_status_kind_seq ON jobs (status, kind, seq);

-- Throughput: jobs finished in the last hour.
CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;
