-- Queued jobs that have a partition, by kind: what lets a claim find out in
-- one probe that none of its kinds' queued jobs has one, and then leave out
-- the partition limits' statements (the tier probes, the limits' CTEs and
-- the rate ledger's writes). Few rows: only jobs of kinds with a partition,
-- and only while they wait.
CREATE INDEX jobs_queued_partitioned ON jobs (kind)
    WHERE status = 'queued' AND partition_key IS NOT NULL;
