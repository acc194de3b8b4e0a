-- Legacy migration 0001_jobs: finishes a database made before 0016_baseline. Never edit.

CREATE SEQUENCE dygo_jobs_id_seq;

CREATE TABLE dygo_jobs (
    id              bigint PRIMARY KEY DEFAULT nextval('dygo_jobs_id_seq'),
    kind            text        NOT NULL,
    queue           text        NOT NULL,
    args            jsonb       NOT NULL DEFAULT '{}',
    meta            jsonb       NOT NULL DEFAULT '{}',
    -- 'scheduled' is not stored: it is a pending job whose run_at is still in the future,
    -- so a due job needs no promotion step before it can be claimed.
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'active', 'succeeded', 'dead', 'paused', 'cancelled')),
    priority        smallint    NOT NULL DEFAULT 0,
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempt         integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL DEFAULT 20 CHECK (max_attempts > 0),
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
    idempotency_key text
);
ALTER SEQUENCE dygo_jobs_id_seq OWNED BY dygo_jobs.id;

CREATE INDEX dygo_jobs_ready ON dygo_jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX dygo_jobs_leases ON dygo_jobs (lease_deadline) WHERE state = 'active';
CREATE UNIQUE INDEX dygo_jobs_live_key ON dygo_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('pending', 'active', 'paused');

CREATE TABLE dygo_idempotency_keys (
    key        text PRIMARY KEY,
    job_id     bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE dygo_workers (
    id           text PRIMARY KEY,  -- <hostname>:<pid>:<short-random>
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queues       jsonb       NOT NULL,  -- {queue name: concurrency}
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);

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
