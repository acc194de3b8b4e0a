-- dygo's schema: durable background jobs in one table (dygo_jobs) that workers claim with SKIP LOCKED,
-- lease, renew and settle; the triggers that wake workers and result waiters by NOTIFY; cron schedules;
-- cluster-wide limits; the rollups behind the stats, the dashboard and /metrics; and the state that
-- every `dygo serve` process shares (dashboard sessions, failed sign-ins).
--
-- The first migration of a fresh database. It numbers 0016 because it replaces the pre-release
-- migrations 0001-0015 (store/migrations/legacy/): versions only grow, so any dygo reading
-- dygo_migrations tells an older schema from a newer one. store/schema.sql is the schema it builds;
-- docs/development/decisions.md says why the schema is as it is.

-- --- Jobs ------------------------------------------------------------------------------------------

CREATE SEQUENCE dygo_jobs_id_seq;

CREATE TABLE dygo_jobs (
    id              bigint PRIMARY KEY DEFAULT nextval('dygo_jobs_id_seq'),
    kind            text        NOT NULL,
    queue           text        NOT NULL,
    args            jsonb       NOT NULL DEFAULT '{}',
    meta            jsonb       NOT NULL DEFAULT '{}',
    -- 'scheduled' is not stored: it is a pending job whose run_at is still in the future.
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'active', 'succeeded', 'dead', 'paused', 'cancelled')),
    priority        smallint    NOT NULL DEFAULT 0,
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempt         integer     NOT NULL DEFAULT 0,
    -- NULL until the first lease resolves it: the job's own, else its kind's, else the configured default.
    max_attempts    integer     CHECK (max_attempts > 0),
    lease_owner     text,
    lease_token     uuid,
    lease_deadline  timestamptz,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    result          jsonb,
    last_error      text,
    errors          jsonb       NOT NULL DEFAULT '[]',  -- [{attempt, at, error, traceback}], oldest first
    reap_count      integer     NOT NULL DEFAULT 0,
    idempotency_key text,
    -- Set when the job dies (dygo_error_fingerprint of last_error); read only together with state = 'dead'.
    dead_fingerprint text,
    -- The handler's latest ctx.progress: {"fraction", "message", "attempt", "at"}; kept after the job settles.
    progress        jsonb
) WITH (
    -- Every job writes its row three times and leaves dead versions behind: vacuum at 1% dead, unthrottled.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER SEQUENCE dygo_jobs_id_seq OWNED BY dygo_jobs.id;

-- The indexes are partial: a job on the hot path (pending -> active -> succeeded) enters only those it needs.
-- The claim reads ready rows in claim order.
CREATE INDEX dygo_jobs_ready ON dygo_jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
-- Recovery finds expired leases.
CREATE INDEX dygo_jobs_leases ON dygo_jobs (lease_deadline) WHERE state = 'active';
-- An idempotency key is unique among live jobs; completion or death frees it.
CREATE UNIQUE INDEX dygo_jobs_live_key ON dygo_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('pending', 'active', 'paused');
-- The admin's lists, counts, purge, retry-all and vacuum of parked jobs, newest first.
CREATE INDEX dygo_jobs_parked ON dygo_jobs (state, id) INCLUDE (queue)
    WHERE state IN ('dead', 'paused', 'cancelled');
-- Dead letters grouped by kind and fingerprint, from the index alone.
CREATE INDEX dygo_jobs_dead_groups ON dygo_jobs (kind, dead_fingerprint, id) INCLUDE (finished_at, queue)
    WHERE state = 'dead';

-- Keys with a time window: they outlive the job they deduplicate; retention trims them by expiry.
CREATE TABLE dygo_idempotency_keys (
    key        text PRIMARY KEY,
    job_id     bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dygo_idempotency_keys_expiry ON dygo_idempotency_keys (expires_at);

-- One row per running worker process, refreshed by its heartbeat (a HOT update: no indexed column changes).
CREATE TABLE dygo_workers (
    id           text PRIMARY KEY,  -- <hostname>:<pid>:<short-random>
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queues       jsonb       NOT NULL,  -- {queue name: concurrency}
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200, fillfactor = 50);

-- Queues an operator paused: the claim skips them. A queue without a row here runs.
CREATE TABLE dygo_queues (
    name      text PRIMARY KEY,
    paused    boolean     NOT NULL DEFAULT false,
    paused_at timestamptz
);

-- Wake workers: one NOTIFY per queue per statement that leaves jobs pending, sent at commit. A job due
-- later notifies too, so idle workers re-arm their timer for its run_at.
CREATE FUNCTION dygo_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_inserted AFTER INSERT ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_pending();
CREATE TRIGGER dygo_jobs_updated AFTER UPDATE ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_pending();

-- A dead job's error fingerprint: the first line of its error with uuids, 0x-hex and whole numbers
-- normalised, so "order 123 failed" and "order 456 failed" group together. The only definition.
CREATE FUNCTION dygo_error_fingerprint(error text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(
    left(split_part(coalesce(error, ''), E'\n', 1), 300),
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
    '(^|[^[:alnum:]_])0x[0-9a-f]+', '\1<hex>', 'gi'),
    '(^|[^[:alnum:]_])[0-9]+', '\1<n>', 'g')
$$;

-- --- Waiting for results -----------------------------------------------------------------------------

-- A waiter (GET /api/v1/jobs/{id}?wait=, store.results) registers a row here, and only the jobs that have
-- one are notified when they become final. A crashed waiter's row expires; retention deletes it.
CREATE TABLE dygo_result_waiters (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dygo_result_waiters_job ON dygo_result_waiters (job_id);
CREATE INDEX dygo_result_waiters_expires ON dygo_result_waiters (expires_at);

-- The lock orders this trigger against a waiter's registration (store/sql/results.py RESULT_WAITERS_LOCK,
-- taken EXCLUSIVE there), so no settle is missed. The chunk size is store.results.NOTIFY_IDS_MAX too.
CREATE FUNCTION dygo_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Claims, lease renewals and retries leave no job final: no lock, no notification.
    IF NOT EXISTS (SELECT FROM new_rows WHERE state IN ('succeeded', 'dead', 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- The key is store/sql/results.py's RESULT_WAITERS_LOCK (two int4 keys: apart from dygo's one-bigint locks).
    PERFORM pg_advisory_xact_lock_shared(hashtext('dygo'), hashtext('dygo.result_waiters'));
    -- A later statement: its snapshot sees every waiter committed before the lock was granted.
    -- At most 390 ids per notification (20 bytes each at most) to stay under the 8000-byte limit.
    PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
    FROM (SELECT n.id, (row_number() OVER ()) / 390 AS chunk FROM new_rows n
          WHERE n.state IN ('succeeded', 'dead', 'cancelled')
            AND EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = n.id)) AS f
    GROUP BY f.chunk;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_finished AFTER UPDATE ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_finished();

-- --- Stats and timings -------------------------------------------------------------------------------

-- Throughput per UTC day, and per UTC minute for the overview's last-hour chart, per queue and kind.
-- Only the fold (store.admin.fold_stats, store.maintenance.fold_stats) writes them: the job path appends
-- to dygo_stats_deltas, so no settle waits on a shared row.
CREATE TABLE dygo_daily_stats (
    day       date   NOT NULL,
    queue     text   NOT NULL,
    kind      text   NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    succeeded bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0,  -- failed attempts, retried or not
    dead      bigint NOT NULL DEFAULT 0,  -- out of attempts, aborted, poison, no handler or archived
    reaped    bigint NOT NULL DEFAULT 0,  -- expired leases recovered
    PRIMARY KEY (day, queue, kind)
);

CREATE TABLE dygo_minute_stats (
    minute    timestamptz NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    enqueued  bigint      NOT NULL DEFAULT 0,
    succeeded bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0,
    dead      bigint      NOT NULL DEFAULT 0,
    reaped    bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue, kind)
);

-- One row per statement that changed counts, by queue and kind; no key and no index, so an insert
-- never waits. Small and churning: vacuumed on a fixed count of dead rows.
CREATE TABLE dygo_stats_deltas (
    day       date        NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    enqueued  integer     NOT NULL DEFAULT 0,
    succeeded integer     NOT NULL DEFAULT 0,
    failed    integer     NOT NULL DEFAULT 0,
    dead      integer     NOT NULL DEFAULT 0,
    reaped    integer     NOT NULL DEFAULT 0,
    at        timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);

-- Enqueues are counted by a statement trigger, so every way in (enqueue, COPY batches, schedules) counts.
CREATE FUNCTION dygo_count_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dygo_stats_deltas (day, queue, kind, enqueued)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM new_rows GROUP BY queue, kind;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_counted AFTER INSERT ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_count_enqueued();

-- Start latency and execution duration histograms for /metrics, cumulative, per queue, kind and measure.
-- buckets[i] counts the observations in (BOUNDS[i-1], BOUNDS[i]] of store.timings.BOUNDS, the last
-- element those above the last bound: changing BOUNDS needs a migration that empties both tables.
-- Workers append deltas; the fold adds them into dygo_timings.
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

-- --- Schedules -----------------------------------------------------------------------------------------

-- One row per declared cron schedule, synced by each worker when it starts and fired by the workers. A
-- declaration that goes away is disabled, not deleted, so its history stays.
CREATE TABLE dygo_schedules (
    name         text PRIMARY KEY,
    spec         text        NOT NULL,                  -- 5-field cron or a descriptor such as @hourly
    timezone     text        NOT NULL DEFAULT 'UTC',    -- IANA name; the spec reads on its wall clock
    kind         text        NOT NULL,
    args         jsonb       NOT NULL DEFAULT '{}',
    queue        text        NOT NULL,
    priority     smallint,                              -- NULL: the kind's
    max_attempts integer,                               -- NULL: the kind's, else the configured default
    -- After downtime: 'once' fires one catch-up job, 'skip' fires none; either way no backfill burst.
    missed       text        NOT NULL DEFAULT 'once' CHECK (missed IN ('once', 'skip')),
    enabled      boolean     NOT NULL DEFAULT true,     -- false: no longer declared
    paused       boolean     NOT NULL DEFAULT false,    -- an operator's hold; survives deploys and syncs
    next_run_at  timestamptz,                           -- the next occurrence to fire
    last_run_at  timestamptz,                           -- when it last fired (on schedule or by hand)
    last_job_id  bigint,                                -- the job that fire enqueued
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dygo_schedules_due ON dygo_schedules (next_run_at) WHERE enabled AND NOT paused;

-- Wake workers when a schedule may fall due sooner than their timers think: added, resumed, re-enabled
-- or moved earlier. Firing only moves next_run_at later, so it wakes nobody.
CREATE FUNCTION dygo_notify_schedule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_schedules', NEW.name);
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_schedules_added AFTER INSERT ON dygo_schedules FOR EACH ROW
    WHEN (NEW.enabled AND NOT NEW.paused) EXECUTE FUNCTION dygo_notify_schedule();
CREATE TRIGGER dygo_schedules_sooner AFTER UPDATE ON dygo_schedules FOR EACH ROW
    WHEN (NEW.enabled AND NOT NEW.paused AND NEW.next_run_at IS NOT NULL
          AND (NOT OLD.enabled OR OLD.paused OR OLD.next_run_at IS NULL OR NEW.next_run_at < OLD.next_run_at))
    EXECUTE FUNCTION dygo_notify_schedule();

-- --- Limits --------------------------------------------------------------------------------------------

-- Concurrency and rate limits per queue or kind, optionally per value of a meta field, enforced by the
-- claim (store/limits.py). The file_* columns hold what config/queues.yml said at the last sync: a sync
-- overwrites a limit only when the file's value changed, so a restart keeps a change made at runtime.
CREATE TABLE dygo_limits (
    scope             text        NOT NULL CHECK (scope IN ('queue', 'kind')),
    name              text        NOT NULL,
    key               text,       -- meta field name: each value of meta.<key> gets its own limit
    concurrency_limit integer     CHECK (concurrency_limit > 0),
    rate_count        integer     CHECK (rate_count > 0),
    rate_window       float8      CHECK (rate_window > 0),  -- seconds
    in_file           boolean     NOT NULL DEFAULT false,
    file_concurrency  integer,
    file_rate         text,
    file_key          text,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name),
    CHECK ((rate_count IS NULL) = (rate_window IS NULL))
);

-- Starts under a rate limit: insert-only, one row per claim per limit and key with its count, so no
-- shared row is updated per job. The maintainer trims rows older than the longest window.
CREATE TABLE dygo_limit_starts (
    scope text        NOT NULL,
    name  text        NOT NULL,
    key   text        NOT NULL DEFAULT '',
    at    timestamptz NOT NULL,
    n     integer     NOT NULL
);
CREATE INDEX dygo_limit_starts_window ON dygo_limit_starts (scope, name, at);

-- --- Authentication state shared by every `dygo serve` process -----------------------------------------

-- Signed-in dashboard sessions: a cookie counts only while its row is here, so signing out ends it
-- everywhere at once. Expired rows are trimmed at each sign-in.
CREATE TABLE dygo_dashboard_sessions (
    sid        text        PRIMARY KEY,
    role       text        NOT NULL CHECK (role IN ('admin', 'read')),
    expires_at timestamptz NOT NULL
);

-- Wrong tokens per client address (API and dashboard alike): the times of the latest ones, at most the
-- limit, so every process sees the same lock-out.
CREATE TABLE dygo_auth_failures (
    address  text          PRIMARY KEY,
    failures timestamptz[] NOT NULL
);
