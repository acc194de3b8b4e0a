"""Typed enqueue as the README shows it; `mypy --strict` passes on it (tests/test_typed_project.py)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.typed_project.receipts import Receipt, send_receipt


def pay(conn: psycopg.Connection[Any], order_id: int, email: str) -> int:
    # --8<-- [start:typed]
    with conn.transaction():
        conn.execute("UPDATE orders SET paid = true WHERE id = %s", (order_id,))
        job = send_receipt.enqueue(conn, Receipt(order_id=order_id, email=email), delay="1m")
    # --8<-- [end:typed]
    return job.id
