"""Read-side queries for the admin service."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from store import queries


def get_job(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(queries.GET_JOB, (job_id,)).fetchone()
