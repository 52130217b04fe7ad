-- Every list of a household's jobs walks that household's own rows only,
-- whatever its filter: with `kind`, through (household_id, kind, seq); with a
-- final status, through (household_id, status, seq) over finished jobs
-- only. Without them a household's `?kind=` list walked every household's
-- jobs of the kind (through `jobs_kind_seq`), and `?status=cancelled` its
-- whole history. The first takes an entry at each insert only (a job's
-- kind never changes); the second at each finish only (a claim moves a job
-- between statuses it does not hold), so neither is rewritten by a claim.
-- Queued and running jobs are found through `jobs_household_queued` and
-- `jobs_running`, which the quota keeps small per household.
CREATE INDEX jobs_household_kind ON jobs (household_id, kind, seq);
CREATE INDEX jobs_household_finished ON jobs (household_id, status, seq)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
