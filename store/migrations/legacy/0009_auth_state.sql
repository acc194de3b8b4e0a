-- Server-side state of authentication, shared by every `dygo serve` process (issue 15).
--
-- dygo_dashboard_sessions: the dashboard sessions that are signed in. The cookie stays a signed value,
-- and a session counts only while its row is here: signing out deletes it, so a cookie copied before
-- is dead everywhere at once. Expired rows are trimmed at each sign-in.
CREATE TABLE dygo_dashboard_sessions (
    sid        text        PRIMARY KEY,
    role       text        NOT NULL CHECK (role IN ('admin', 'read')),
    expires_at timestamptz NOT NULL
);

-- dygo_auth_failures: wrong tokens per client address (API bearer tokens and dashboard sign-ins alike),
-- the times of the most recent ones (at most the limit), so every process sees the same lock-out.
CREATE TABLE dygo_auth_failures (
    address  text          PRIMARY KEY,
    failures timestamptz[] NOT NULL
);
