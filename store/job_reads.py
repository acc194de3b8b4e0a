"""One job's whole row by id: the job pages of the API and the dashboard, `?wait=`, `dygo job` and
`store.results` read it here."""

from __future__ import annotations

from typing import Any

import psycopg
from dygo.store.sql import job_reads as sql
from psycopg.rows import dict_row


def get_job(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(sql.GET_JOB, (job_id,)).fetchone()


async def aget_job(conn: psycopg.AsyncConnection, job_id: int) -> dict[str, Any] | None:
    """`get_job` for an AsyncConnection (the admin service's hot read)."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(sql.GET_JOB, (job_id,))
        return await cursor.fetchone()
