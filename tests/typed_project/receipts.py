"""A job with typed args, declared as a project does it: the docs' examples and the mypy test use it."""

from __future__ import annotations

from pydantic import BaseModel

from dygo import JobContext, job


class Receipt(BaseModel):
    order_id: int
    email: str


@job("shop.send_receipt")
async def send_receipt(ctx: JobContext, args: Receipt) -> dict[str, int]:
    return {"order_id": args.order_id}
