-- A job's duration bucket by arithmetic, not by a query of the bounds'
-- table: the statement-level triggers call it twice a job, and as a SQL
-- function with a subquery (planned and run through SPI at every call) it
-- cost the server more a job than the rest of the bookkeeping. Bucket k
-- (1 to 47) starts at 0.01 s times √2^(k-1): the logarithm finds k to
-- within one, and the bounds as `job_duration_buckets` stores them (which
-- the dashboard reads; repeated here, rounded as stored) settle it, so the
-- answer is the table's exactly (tests/test_duration_buckets.py compares
-- them). IMMUTABLE and without a FROM, so the planner inlines them.

-- Bucket k's lower bound at [k], k = 1 to 47, and no bound past the last.
CREATE FUNCTION job_duration_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY[
        0.01, 0.014142136, 0.02, 0.028284271, 0.04, 0.056568542,
        0.08, 0.113137085, 0.16, 0.22627417, 0.32, 0.45254834,
        0.64, 0.90509668, 1.28, 1.81019336, 2.56, 3.62038672,
        5.12, 7.240773439, 10.24, 14.481546879, 20.48, 28.963093757,
        40.96, 57.926187515, 81.92, 115.85237503, 163.84, 231.704750059,
        327.68, 463.409500118, 655.36, 926.819000237, 1310.72, 1853.638000474,
        2621.44, 3707.276000947, 5242.88, 7414.552001895, 10485.76, 14829.104003789,
        20971.52, 29658.208007579, 41943.04, 59316.416015157, 83886.08,
        'Infinity'
    ]::double precision[]
$$;

-- The bucket of `seconds`, given k that is its bucket or one beside it.
CREATE FUNCTION job_duration_bucket_near(seconds double precision, k integer)
RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (k - (seconds < (job_duration_bounds())[k])::integer
              + (seconds >= (job_duration_bounds())[k + 1])::integer)::smallint
$$;

CREATE OR REPLACE FUNCTION job_duration_bucket(seconds double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN seconds IS NULL OR NOT seconds >= 0.01 THEN 0::smallint
        WHEN seconds >= 83886.08 THEN 47::smallint
        ELSE job_duration_bucket_near(
            seconds, least(47, 1 + floor(2.0 * ln(seconds / 0.01) / ln(2.0))::integer)
        )
    END
$$;
