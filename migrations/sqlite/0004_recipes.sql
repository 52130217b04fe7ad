-- 0004: recipes a household imported (the `recipe_import` job kind stores them).
--
-- seq is the insertion order and orders the newest-first listing; id is the
-- public id. job_id makes the import idempotent per job: the kind upserts on
-- it, so a retried or rescued job updates its recipe instead of adding a
-- second one. A recipe outlives the job that imported it, so deleting the job
-- only clears job_id. Lists are JSON arrays of strings.
CREATE TABLE recipes (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE CHECK (length(id) = 32),
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    job_id TEXT UNIQUE REFERENCES jobs (id) ON DELETE SET NULL,
    title TEXT NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    ingredients TEXT NOT NULL
        CHECK (CASE WHEN json_valid(ingredients) THEN json_type(ingredients) = 'array' ELSE 0 END),
    instructions TEXT NOT NULL
        CHECK (CASE WHEN json_valid(instructions) THEN json_type(instructions) = 'array' ELSE 0 END),
    yields TEXT CHECK (yields IS NULL OR length(yields) BETWEEN 1 AND 200),
    total_time_minutes INTEGER
        CHECK (total_time_minutes IS NULL OR total_time_minutes BETWEEN 0 AND 100000),
    image_url TEXT CHECK (image_url IS NULL OR length(image_url) BETWEEN 1 AND 2048),
    source_url TEXT NOT NULL CHECK (length(source_url) BETWEEN 1 AND 2048),
    author TEXT CHECK (author IS NULL OR length(author) BETWEEN 1 AND 200),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- A household's recipes, newest first.
CREATE INDEX recipes_household ON recipes (household_id, seq);
