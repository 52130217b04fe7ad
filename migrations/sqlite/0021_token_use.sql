-- A token's name (what its holder calls it: "kitchen tablet"), and when it
-- was last used, so that `flask tokens list` lets an operator see which
-- token to revoke. `last_used_at` is written at most once a minute a token
-- a process (`mealquest.households.note_token_use`), so that a request pays for it rarely.
ALTER TABLE api_tokens ADD COLUMN name TEXT CHECK (name IS NULL OR length(name) <= 100);
ALTER TABLE api_tokens ADD COLUMN last_used_at TEXT;
