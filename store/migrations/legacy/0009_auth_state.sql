-- Legacy migration 0009_auth_state: finishes a database made before 0016_baseline. Never edit.

CREATE TABLE dygo_dashboard_sessions (
    sid        text        PRIMARY KEY,
    role       text        NOT NULL CHECK (role IN ('admin', 'read')),
    expires_at timestamptz NOT NULL
);

CREATE TABLE dygo_auth_failures (
    address  text          PRIMARY KEY,
    failures timestamptz[] NOT NULL
);
