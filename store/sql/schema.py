"""The migrations' bookkeeping: the dygo_migrations table, its lock, and the schema version it records.

Run by store/migrate.py (`dygo migrate`, a revert, the readiness check), store/leases.py (a worker's
schema check at start) and store/db.py (a worker's check that it reached the primary).
"""

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS dygo_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# Two `dygo migrate` at once: the second waits here, then finds nothing left to apply.
MIGRATIONS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo.migrate'))"
APPLIED_VERSIONS = "SELECT version, name FROM dygo_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO dygo_migrations (version, name) VALUES (%s, %s)"
# A down step undone: its version is no longer applied.
FORGET_MIGRATION = "DELETE FROM dygo_migrations WHERE version = %s"
# The migrations table may not exist yet, so its name is looked up before it is read.
HAS_MIGRATIONS_TABLE = "SELECT to_regclass('dygo_migrations') IS NOT NULL"
SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM dygo_migrations"
# Whether the session cannot write: the server is a standby (in recovery), or its transactions are read-only
# by default (default_transaction_read_only, as some providers set on a replica). A worker waits (store/db.py).
READ_ONLY_SESSION = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean"
