-- Table health under sustained load (bench/table_health.py, README "Table health").
--
-- Every job writes its row three times (enqueue, claim, settle), and neither update can be HOT: `state`
-- is in the predicates of the partial indexes and `lease_deadline` is a key of dygo_jobs_leases. So each
-- job leaves two dead row versions, an entry in dygo_jobs_ready that is dead once the job is claimed, and
-- three entries in the primary key; retention's delete adds one more dead version. Every claim walks
-- dygo_jobs_ready from its oldest end across the dead entries until a vacuum removes them, so the claim
-- gets slower for as long as vacuum waits. PostgreSQL's defaults wait until 20% of the table is dead
-- (200,000 versions on a 1M-row table: under half a minute at 10k jobs/s) and then throttle the vacuum.
--
-- Here: vacuum once 1% of the table (plus 5,000 versions) is dead, unthrottled (it is a pass over a
-- table whose finished rows are all-visible and skipped), and analyze as the mix of states shifts.
-- Inserts count too, so pending rows' pages get marked all-visible soon after they settle.
-- How often autovacuum looks at a database at all is the server-wide autovacuum_naptime (1 min by
-- default), which a migration must not change on a server dygo does not own: the README says why
-- 10s suits a busy queue; the embedded server is started with it.
-- SET (...) on a table takes a SHARE UPDATE EXCLUSIVE lock: running workers and enqueues carry on.
ALTER TABLE dygo_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- Stats deltas: a row per settle batch, deleted in bulk by every fold; worker heartbeats: a row per
-- worker updated every few seconds (HOT: no indexed column changes). Both are small and churn
-- constantly: vacuum them on a fixed count of dead rows, not a share of a tiny table.
ALTER TABLE dygo_stats_deltas SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE dygo_workers SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    fillfactor = 50
);
