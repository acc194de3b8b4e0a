"""Typed enqueue gone wrong: `mypy --strict` reports each marked line (tests/test_typed_project.py)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.typed_project.receipts import Receipt, send_receipt


def pay(conn: psycopg.Connection[Any], order_id: int) -> None:
    send_receipt.enqueue(conn, Receipt(order_id=order_id, emial="a@example.com"))  # wrong: a misspelt field
    send_receipt.enqueue(conn, {"order_id": order_id, "email": "a@example.com"})  # wrong: a dict, not a Receipt
    send_receipt.enqueue(conn, Receipt(order_id=order_id, email="a@example.com"), priority="high")  # wrong: option
