"""Timings: the start latency and execution duration histograms, per queue, kind and measure.

Run by store/timings.py (a worker's flush of its observations, GET /metrics' read) and store/admin.py (the
fold, with the stats fold; `nuke`). Bucket arrays add element by element: one row per (queue, kind,
measure, bucket position) summed (`per_bucket`, `totals`), then gathered back into an array in bucket
order.
"""

# One row per queue, kind and measure that saw observations since the worker's last flush; buckets
# arrive as array literals ('{1,0,2}'), since unnest would flatten a two-dimensional array.
RECORD_TIMINGS = """
INSERT INTO dygo_timing_deltas (queue, kind, measure, buckets, sum, count)
SELECT queue, kind, measure, buckets::bigint[], sum, count
FROM unnest(%(queues)s::text[], %(kinds)s::text[], %(measures)s::text[], %(buckets)s::text[],
            %(sums)s::float8[], %(counts)s::bigint[]) AS t(queue, kind, measure, buckets, sum, count)"""

# Run under sql/stats.py's FOLD_STATS_LOCK, with FOLD_STATS.
FOLD_TIMINGS = """
WITH moved AS (DELETE FROM dygo_timing_deltas RETURNING *),

per_bucket AS (
    SELECT queue, kind, measure, i, sum(b)::bigint AS n
    FROM moved, unnest(buckets) WITH ORDINALITY AS u(b, i) GROUP BY queue, kind, measure, i
), totals AS (
    SELECT queue, kind, measure, sum(sum)::float8 AS sum, sum(count)::bigint AS count
    FROM moved GROUP BY queue, kind, measure
)
INSERT INTO dygo_timings AS s (queue, kind, measure, buckets, sum, count)

SELECT p.queue, p.kind, p.measure, array_agg(p.n ORDER BY p.i) AS buckets, t.sum, t.count
FROM per_bucket p JOIN totals t USING (queue, kind, measure)
GROUP BY p.queue, p.kind, p.measure, t.sum, t.count
ON CONFLICT (queue, kind, measure) DO UPDATE SET
    buckets = ARRAY(SELECT a + b FROM unnest(s.buckets, excluded.buckets) WITH ORDINALITY AS u(a, b, i) ORDER BY i),
    sum = s.sum + excluded.sum, count = s.count + excluded.count"""

# Folded rows plus deltas not folded yet, per queue, kind and measure: never job rows.
METRICS_TIMINGS = """
WITH timing_rows AS (
    SELECT queue, kind, measure, buckets, sum, count FROM dygo_timings
    UNION ALL
    SELECT queue, kind, measure, buckets, sum, count FROM dygo_timing_deltas
),

per_bucket AS (
    SELECT queue, kind, measure, i, sum(b)::bigint AS n
    FROM timing_rows, unnest(buckets) WITH ORDINALITY AS u(b, i) GROUP BY queue, kind, measure, i
), totals AS (
    SELECT queue, kind, measure, sum(sum)::float8 AS sum, sum(count)::bigint AS count
    FROM timing_rows GROUP BY queue, kind, measure
)

SELECT p.queue, p.kind, p.measure, array_agg(p.n ORDER BY p.i) AS buckets, t.sum, t.count
FROM per_bucket p JOIN totals t USING (queue, kind, measure)
GROUP BY p.queue, p.kind, p.measure, t.sum, t.count
ORDER BY p.queue, p.kind, p.measure"""

NUKE_TIMINGS = """
WITH deltas AS (DELETE FROM dygo_timing_deltas RETURNING 1), timings AS (DELETE FROM dygo_timings RETURNING 1)
SELECT (SELECT count(*) FROM deltas) + (SELECT count(*) FROM timings)"""
