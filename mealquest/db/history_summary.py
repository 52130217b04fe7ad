"""What both drivers' history read shares: the SQL that sums a kind's period
and finds its percentiles' buckets, over a driver's own `h` (the period's rows
of `job_history`: period, kind, series, bucket, count).

A percentile's bucket is found in the database, by a running sum over the
buckets in order: the nearest-rank p-th percentile of n durations is the
smallest bucket whose running sum reaches p % of n (a running sum is whole,
so reaching p * n / 100 is reaching its ceiling). The read returns one row
per kind and period, whatever the number of buckets used, so a day of
ten-minute periods costs the service a few hundred rows.
"""

from __future__ import annotations

SUMMARY = """
d AS (
    SELECT period, kind, CASE WHEN series = 'wait' THEN 0 ELSE 1 END AS measure, bucket,
        sum(count) AS n
    FROM h WHERE bucket >= 0 GROUP BY period, kind, measure, bucket
),
c AS (
    SELECT period, kind, measure, bucket,
        sum(n) OVER (PARTITION BY period, kind, measure ORDER BY bucket
                     ROWS UNBOUNDED PRECEDING) AS cum,
        sum(n) OVER (PARTITION BY period, kind, measure) AS total
    FROM d
),
p AS (
    SELECT period, kind,
        max(CASE WHEN measure = 0 THEN total END) AS started,
        min(CASE WHEN measure = 0 AND cum * 2 >= total THEN bucket END) AS wait_p50,
        min(CASE WHEN measure = 0 AND cum * 100 >= total * 95 THEN bucket END) AS wait_p95,
        min(CASE WHEN measure = 1 AND cum * 2 >= total THEN bucket END) AS run_p50,
        min(CASE WHEN measure = 1 AND cum * 100 >= total * 95 THEN bucket END) AS run_p95
    FROM c GROUP BY period, kind
),
o AS (
    SELECT period, kind,
        sum(CASE WHEN series = 'succeeded' THEN count ELSE 0 END) AS succeeded,
        sum(CASE WHEN series = 'failed' THEN count ELSE 0 END) AS failed,
        sum(CASE WHEN series = 'cancelled' THEN count ELSE 0 END) AS cancelled
    FROM h GROUP BY period, kind
)
SELECT o.period, o.kind, o.succeeded, o.failed, o.cancelled, coalesce(p.started, 0) AS started,
    p.wait_p50, p.wait_p95, p.run_p50, p.run_p95
FROM o LEFT JOIN p ON p.period = o.period AND p.kind = o.kind
"""
