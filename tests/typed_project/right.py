"""Typed enqueue as the README shows it; `mypy --strict` passes on it (tests/test_typed_project.py)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.typed_project.emails import SendEmail, send_email


def sign_up(conn: psycopg.Connection[Any], email: str) -> int:
    # --8<-- [start:typed]
    with conn.transaction():
        conn.execute("INSERT INTO users (email) VALUES (%s)", (email,))
        job = send_email.enqueue(conn, SendEmail(to=email, subject="Welcome"), delay="10m")
    # --8<-- [end:typed]
    return job.id
