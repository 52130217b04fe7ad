-- Fewer index entries per job. Each index on `jobs` costs every insert (and,
-- when it holds `status`, every state change) its own B-tree writes; these
-- three serve no query that runs often:
--
-- `jobs_finished_at` is the very same index as `jobs_finished` (finished_at,
-- where set): the operators' throughput figure and retention both read
-- `jobs_finished`.
--
-- `jobs_household_status` (household_id, status, seq) and
-- `jobs_household_kind` (household_id, kind, seq) served only a household's
-- job listing filtered by status or kind. `jobs_household` (household_id,
-- seq) walks the household's jobs newest first and stops at the page's
-- limit; queued jobs (a few, the quota bounds them) are found through
-- `jobs_household_queued` and running ones through `jobs_running`. The
-- status index was rewritten by every claim and every outcome: measured,
-- dropping the three cut the WAL pages a job writes over its life (enqueue,
-- claim, completion) by about a quarter.
DROP INDEX jobs_finished_at;
DROP INDEX jobs_household_status;
DROP INDEX jobs_household_kind;
