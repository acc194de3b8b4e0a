"""A pooled database connection per request, for the sync endpoints (FastAPI runs them in threads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import psycopg
from fastapi import Depends, Request


def _connection(request: Request) -> Iterator[psycopg.Connection]:
    with request.app.state.pool.connection() as conn:
        yield conn


# An autocommit connection: each statement commits on its own unless wrapped in conn.transaction().
Conn = Annotated[psycopg.Connection, Depends(_connection)]
