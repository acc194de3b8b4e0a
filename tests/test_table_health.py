"""What keeps the tables healthy under load: per-table autovacuum (migration 0008), the embedded server's
autovacuum naptime, and workers trimming heartbeat rows of workers that are gone.

The load itself is measured by bench/table_health.py (minutes, not part of the suite).
"""

from __future__ import annotations

import json

import psycopg

from tests.conftest import wait_until


def reloptions(conn: psycopg.Connection, table: str) -> dict[str, str]:
    row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (table,)).fetchone()
    return dict(option.split("=", 1) for option in row[0] or [])


def test_job_table_is_vacuumed_early_and_unthrottled(conn):
    jobs = reloptions(conn, "dygo_jobs")
    assert float(jobs["autovacuum_vacuum_scale_factor"]) <= 0.01
    assert float(jobs["autovacuum_vacuum_insert_scale_factor"]) <= 0.01
    assert jobs["autovacuum_vacuum_cost_delay"] == "0"
    assert reloptions(conn, "dygo_stats_deltas")["autovacuum_vacuum_scale_factor"] == "0"


def test_embedded_server_visits_each_database_every_ten_seconds(server_url, conn):
    if "host=/" not in server_url and "?host=" not in server_url:
        return  # DATABASE_URL names a server dygo does not own: its settings are the operator's
    assert conn.execute("SHOW autovacuum_naptime").fetchone()[0] == "10s"


def test_worker_trims_heartbeat_rows_of_workers_that_are_gone(conn, spawn):
    conn.execute(
        """
        INSERT INTO dygo_workers (id, hostname, pid, queues, started_at, last_seen_at) VALUES
            ('gone:1:aaaa', 'gone', 1, %(queues)s, now() - interval '2 hours', now() - interval '10 minutes'),
            ('quiet:2:bbbb', 'quiet', 2, %(queues)s, now() - interval '2 hours', now() - interval '20 seconds')""",
        {"queues": json.dumps({"default": 1})},
    )
    process = spawn("worker")
    process.wait_for_line("started")

    def ids() -> set[str]:
        return {row[0] for row in conn.execute("SELECT id FROM dygo_workers")}

    # The maintenance tick (every 5 s) forgets rows not seen for a minute; one seen 20 s ago may just be slow.
    wait_until(lambda: "gone:1:aaaa" not in ids(), timeout=20, message="the stale heartbeat row to go")
    assert "quiet:2:bbbb" in ids() and len(ids()) == 2  # the quiet one and the running worker's own
