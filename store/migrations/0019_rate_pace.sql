-- Smooth rate limits: a rate limit hands out start times spaced through its window (GCRA, store/claim.py)
-- rather than counting starts in a sliding window, so the handlers' starts, not only the claims, keep to it.
--
-- dygo_limit_pace holds, per rate limit and key, the theoretical time of its next start (`next_at`): the one
-- row a claim reads and moves forward under the limit's lock. A row whose next_at has passed says nothing
-- more than no row (the limit is idle): the worker's maintenance deletes those (sql/limits.py TRIM_PACE).
-- `rate_burst`: how many starts may come at once after an idle spell (NULL: 1, evenly spaced);
-- `file_burst`: the file's value at the last sync, as file_rate is for rate_limit.
CREATE TABLE dygo_limit_pace (
    scope   text        NOT NULL,
    name    text        NOT NULL,
    key     text        NOT NULL DEFAULT '',
    next_at timestamptz NOT NULL,
    PRIMARY KEY (scope, name, key)
);

ALTER TABLE dygo_limits
    ADD COLUMN rate_burst integer CHECK (rate_burst > 0 AND rate_burst <= rate_count),
    ADD COLUMN file_burst integer;

-- A claim under queues' own limits (store/claim.py CLAIM_QUEUE_LIMITED) is one statement: this function takes
-- the limits' locks (`keys`, ascending), then reads each queue's use under them: its active jobs (if
-- `counted`), its rate's next start (if `rated`) and the clock. VOLATILE, so its second query reads with a
-- snapshot of its own, taken after the locks: it counts every claim that committed while this one waited.
CREATE FUNCTION dygo_queue_limits_use(keys bigint[], queues text[], counted boolean[], rated boolean[])
RETURNS TABLE (queue text, active integer, next_at timestamptz, clock timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM count(pg_advisory_xact_lock(k)) FROM unnest(keys) AS k;
    RETURN QUERY
    SELECT q.queue,
           (SELECT count(*)::integer FROM dygo_jobs j WHERE q.counted AND j.state = 'active' AND j.queue = q.queue),
           (SELECT p.next_at FROM dygo_limit_pace p
            WHERE q.rated AND p.scope = 'queue' AND p.name = q.queue AND p.key = ''),
           clock_timestamp()
    FROM unnest(queues, counted, rated) AS q(queue, counted, rated);
END
$$;
