-- Start latency and execution duration histograms per queue and kind, for GET /metrics.
--
-- Workers count observations in memory into fixed buckets (store.timings.BOUNDS) and append one
-- row per queue, kind and measure every few seconds: no key and no index, so an insert never
-- waits for anyone and no job ever writes a shared row. The stats folder (store.admin.fold_stats,
-- and the retention pass) adds the deltas into dygo_timings, one row per queue, kind and measure.
-- Not per day: these are cumulative histograms, never trimmed, and the row count is bounded by
-- queues x kinds x 2.
--
-- buckets[i] counts the observations in (BOUNDS[i-1], BOUNDS[i]]; the last element counts those
-- above the last bound. Changing BOUNDS needs a migration that empties both tables.
CREATE TABLE dygo_timing_deltas (
    queue   text     NOT NULL,
    kind    text     NOT NULL,
    measure text     NOT NULL CHECK (measure IN ('latency', 'duration')),
    buckets bigint[] NOT NULL,
    sum     float8   NOT NULL,
    count   bigint   NOT NULL
);

CREATE TABLE dygo_timings (
    queue   text     NOT NULL,
    kind    text     NOT NULL,
    measure text     NOT NULL CHECK (measure IN ('latency', 'duration')),
    buckets bigint[] NOT NULL,
    sum     float8   NOT NULL,
    count   bigint   NOT NULL,
    PRIMARY KEY (queue, kind, measure)
);
