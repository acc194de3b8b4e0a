"""A pooled database connection per request, for the sync endpoints (FastAPI runs them in threads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import psycopg
from fastapi import Depends, Request

OUTAGE_WAIT = 1.0  # seconds a request waits for a connection while the database is known to be down


def _connection(request: Request) -> Iterator[psycopg.Connection]:
    # During a known outage a request waits briefly, so callers get their 503 at once rather than
    # after the pool's full timeout; the pool keeps reconnecting in the background meanwhile.
    timeout = OUTAGE_WAIT if request.app.state.outage.down else None
    with request.app.state.pool.connection(timeout=timeout) as conn:
        yield conn
    # Reached only when the request's database work went through: ends a logged outage, if any.
    request.app.state.outage.back()


# An autocommit connection: each statement commits on its own unless wrapped in conn.transaction().
Conn = Annotated[psycopg.Connection, Depends(_connection)]
