-- A job's duration bucket in one expression the planner inlines into the
-- statement-level triggers' queries: `width_bucket` over the bounds (in C,
-- a binary search), naming `seconds` once. The planner does not inline a
-- SQL function that names an argument more than once when the argument is
-- costly, as the triggers' `extract(epoch FROM ...)` is: 0020's
-- `job_duration_bucket_near` was so set up and run apart at every call, for
-- every job a claim took after it had waited 0.01 s or more. The buckets are
-- the same (tests/drivers/test_postgresql.py compares them with
-- `job_duration_buckets` on every bound and 12,001 durations): bucket k is
-- the number of bounds at or below `seconds`, 0 below the first (or for
-- NULL), and 47 from the last on (NaN and infinity included).
CREATE OR REPLACE FUNCTION job_duration_bucket(seconds double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(coalesce(width_bucket(seconds, job_duration_bounds()), 0), 47)::smallint
$$;

DROP FUNCTION job_duration_bucket_near(double precision, integer);
