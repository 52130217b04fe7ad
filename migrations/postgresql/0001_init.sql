-- The whole schema on PostgreSQL, as the SQLite migrations leave it after 0005.
-- Times are timestamptz from the database's clock (every host reads the same
-- clock); JSON is kept as the text the service wrote, as on SQLite.

-- Households and their API tokens. A token is stored only as the hex SHA-256
-- digest of its text: the clear token is shown once, when it is created.
CREATE TABLE households (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    household_id bigint NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    token_sha256 text NOT NULL UNIQUE CHECK (char_length(token_sha256) = 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX api_tokens_household ON api_tokens (household_id);

-- The jobs table is the queue. States, and what moves a job out of each:
--   queued    -> running   the pool's claim
--   running   -> queued    a retry, the rescuer, or a stopping pool (attempts left)
--   running   -> succeeded the worker that holds the lease
--   running   -> failed    the worker that holds the lease, the rescuer, or a stopping pool
--
-- seq is the insertion order: it breaks ties in "oldest first" and orders
-- the newest-first listings.
--
-- on_interrupt is what an interruption (a stop that cut the job short, or
-- the death of its process) does: 'requeue' puts it back with its attempt
-- refunded and fails it 'interrupted by restart' at the 3rd interruption in
-- a row; 'fail' fails it at once. interruptions counts them in a row.
CREATE TABLE jobs (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text NOT NULL UNIQUE,
    household_id bigint NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    kind text NOT NULL CHECK (kind <> ''),
    payload text NOT NULL,
    status text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    result text,
    error text,
    attempt integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts integer NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    run_at timestamptz NOT NULL,
    lease_owner text,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz,
    on_interrupt text NOT NULL DEFAULT 'fail' CHECK (on_interrupt IN ('requeue', 'fail')),
    interruptions integer NOT NULL DEFAULT 0 CHECK (interruptions >= 0),
    CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'failed') = (error IS NOT NULL)),
    CHECK (status = 'queued' OR attempt >= 1)
);

-- The claim: oldest due queued job first. Partial, so finished jobs cost it nothing.
CREATE INDEX jobs_claim ON jobs (run_at, seq) WHERE status = 'queued';

-- The rescuer: expired leases.
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE status = 'running';

-- A household's jobs, newest first, optionally by status or kind.
CREATE INDEX jobs_household ON jobs (household_id, seq);
CREATE INDEX jobs_household_status ON jobs (household_id, status, seq);
CREATE INDEX jobs_household_kind ON jobs (household_id, kind, seq);

-- Recipes a household imported (the `recipe_import` job kind stores them).
--
-- seq is the insertion order and orders the newest-first listing; id is the
-- public id. job_id makes the import idempotent per job: the kind upserts on
-- it, so a retried or rescued job updates its recipe instead of adding a
-- second one. A recipe outlives the job that imported it, so deleting the job
-- only clears job_id. Lists are JSON arrays of strings, kept as text.
CREATE TABLE recipes (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text NOT NULL UNIQUE CHECK (char_length(id) = 32),
    household_id bigint NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    job_id text UNIQUE REFERENCES jobs (id) ON DELETE SET NULL,
    title text NOT NULL CHECK (char_length(title) BETWEEN 1 AND 500),
    -- A text that is not JSON fails the cast, which rejects the row too.
    ingredients text NOT NULL CHECK (jsonb_typeof(ingredients::jsonb) = 'array'),
    instructions text NOT NULL CHECK (jsonb_typeof(instructions::jsonb) = 'array'),
    yields text CHECK (yields IS NULL OR char_length(yields) BETWEEN 1 AND 200),
    total_time_minutes integer
        CHECK (total_time_minutes IS NULL OR total_time_minutes BETWEEN 0 AND 100000),
    image_url text CHECK (image_url IS NULL OR char_length(image_url) BETWEEN 1 AND 2048),
    source_url text NOT NULL CHECK (char_length(source_url) BETWEEN 1 AND 2048),
    author text CHECK (author IS NULL OR char_length(author) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- A household's recipes, newest first.
CREATE INDEX recipes_household ON recipes (household_id, seq);
