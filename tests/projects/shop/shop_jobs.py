"""A tiny shop's jobs: the example of docs/guides/testing.md, tested by tests/test_testing_plugin.py."""

import os

import psycopg
from pydantic import BaseModel

from dygo import JobContext, enqueue, job


# --8<-- [start:jobs]
class Order(BaseModel):
    order_id: int


@job("orders.place")
def place_order(ctx: JobContext, args: Order) -> dict:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        enqueue(conn, "emails.receipt", {"order_id": args.order_id})  # a job that enqueues another
    return {"placed": args.order_id}


@job("emails.receipt", max_attempts=3)
def send_receipt(ctx: JobContext, args: dict) -> dict:
    if ctx.attempt == 1:
        raise ConnectionError("the mail server is busy")  # retried with backoff
    return {"sent": args["order_id"]}


# --8<-- [end:jobs]


@job("reports.nightly")
def nightly_report(ctx: JobContext, args: dict) -> str:
    return "report written"
