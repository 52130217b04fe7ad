-- The dashboard's sign-ins, kept on the server: the session cookie carries
-- only a random id, and this table its SHA-256 digest (a copy of the table
-- lets no one in). Signing out deletes the row, and revoking the operator
-- deletes all of its rows, so a cookie copied before either opens nothing
-- after it; a row past `expires_at` (MEALQUEST_DASHBOARD_SESSION_HOURS after
-- its sign-in) opens nothing either, and the next sign-in deletes it.
CREATE TABLE dashboard_sessions (
    id_sha256 text PRIMARY KEY CHECK (char_length(id_sha256) = 64),
    operator_id bigint NOT NULL REFERENCES operators (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- An operator's sessions: revoked together, and only its newest few kept.
CREATE INDEX dashboard_sessions_operator ON dashboard_sessions (operator_id, created_at);
-- Expired sessions, deleted at each sign-in.
CREATE INDEX dashboard_sessions_expires ON dashboard_sessions (expires_at);
