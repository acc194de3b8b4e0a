"""Authentication state shared by every serve process: dashboard sessions and the failed-token throttle.

Run by store/auth_state.py (app/throttle.py and the dashboard's sessions, app/dashboard/visitor.py, call it).
"""

INSERT_DASHBOARD_SESSION = """
INSERT INTO dygo_dashboard_sessions (sid, role, expires_at) VALUES (%s, %s, to_timestamp(%s))"""
TRIM_DASHBOARD_SESSIONS = "DELETE FROM dygo_dashboard_sessions WHERE expires_at < now()"
DASHBOARD_SESSION_ROLE = "SELECT role FROM dygo_dashboard_sessions WHERE sid = %s AND expires_at > now()"
END_DASHBOARD_SESSION = "DELETE FROM dygo_dashboard_sessions WHERE sid = %s"

# Keeps the address's failures inside the window, newest `attempts` of them, oldest first; answers when
# the address may try again (epoch seconds), or NULL while it has fewer than `attempts` recent failures
# in the window (the same CASE as AUTH_LOCKED_UNTIL).
RECORD_AUTH_FAILURE = """
INSERT INTO dygo_auth_failures AS f (address, failures) VALUES (%(address)s, ARRAY[clock_timestamp()])
ON CONFLICT (address) DO UPDATE SET failures = (
    SELECT coalesce(array_agg(t ORDER BY t), '{}') FROM (
        SELECT t FROM unnest(f.failures || clock_timestamp()) AS t
        WHERE t > clock_timestamp() - make_interval(secs => %(window)s)
        ORDER BY t DESC LIMIT %(attempts)s) AS recent)
RETURNING CASE WHEN cardinality(failures) >= %(attempts)s
    AND failures[cardinality(failures) - %(attempts)s + 1] > clock_timestamp() - make_interval(secs => %(window)s)
    THEN extract(epoch FROM failures[cardinality(failures) - %(attempts)s + 1]
                 + make_interval(secs => %(window)s))::float8 END"""

# Addresses whose newest failure left the window: forgotten (run with each recorded failure).
TRIM_AUTH_FAILURES = """
DELETE FROM dygo_auth_failures
WHERE failures[cardinality(failures)] < clock_timestamp() - make_interval(secs => %(window)s)"""

# One row when the address has failures on record: (locked until, or NULL).
AUTH_LOCKED_UNTIL = """
SELECT CASE WHEN cardinality(failures) >= %(attempts)s
    AND failures[cardinality(failures) - %(attempts)s + 1] > clock_timestamp() - make_interval(secs => %(window)s)
    THEN extract(epoch FROM failures[cardinality(failures) - %(attempts)s + 1]
                 + make_interval(secs => %(window)s))::float8 END FROM dygo_auth_failures WHERE address = %(address)s"""

CLEAR_AUTH_FAILURES = "DELETE FROM dygo_auth_failures WHERE address = %s"

# Each recorded failure names its address on this channel (delivered at commit), so every serve process
# knows which addresses it must check in the table and can admit every other one without a read.
LISTEN_FOR_AUTH_FAILURES = "LISTEN dygo_auth_failures"
NOTIFY_AUTH_FAILURE = "SELECT pg_notify('dygo_auth_failures', %(address)s)"
# Run right after LISTEN_FOR_AUTH_FAILURES: what was recorded before it, the notifications tell the rest.
AUTH_FAILURE_ADDRESSES = "SELECT address FROM dygo_auth_failures"
