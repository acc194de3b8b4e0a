"""Typed enqueue gone wrong: `mypy --strict` reports each marked line (tests/test_typed_project.py)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.typed_project.emails import SendEmail, send_email


def sign_up(conn: psycopg.Connection[Any], email: str) -> None:
    send_email.enqueue(conn, SendEmail(to=email, subjet="Welcome"))  # wrong: a misspelt field
    send_email.enqueue(conn, {"to": email, "subject": "Welcome"})  # wrong: a dict, not a SendEmail
    send_email.enqueue(conn, SendEmail(to=email, subject="Welcome"), priority="high")  # wrong: an option's type
