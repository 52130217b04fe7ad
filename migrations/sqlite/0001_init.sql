-- Households and their API tokens. A token is stored only as the hex SHA-256
-- digest of its text: the clear token is shown once, when it is created.
CREATE TABLE households (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at TEXT NOT NULL
);

CREATE TABLE api_tokens (
    id INTEGER PRIMARY KEY,
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    token_sha256 TEXT NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    created_at TEXT NOT NULL,
    revoked_at TEXT
);

CREATE INDEX api_tokens_household ON api_tokens (household_id);
