"""The embedded server's settings: what dygo sets server-wide on a PostgreSQL it owns.

Run by store/embedded.py each time it starts (or attaches to) the embedded server.
"""

# dygo owns the embedded server, so it may tune it server-wide: autovacuum visits each database every
# naptime (1 min by default), too rarely for a queue table settling thousands of jobs a second. A reload
# applies it; no restart.
EMBEDDED_NAPTIME = "10s"
AUTOVACUUM_NAPTIME = "SELECT current_setting('autovacuum_naptime')"
SET_AUTOVACUUM_NAPTIME = f"ALTER SYSTEM SET autovacuum_naptime = '{EMBEDDED_NAPTIME}'"
RELOAD_CONFIGURATION = "SELECT pg_reload_conf()"
