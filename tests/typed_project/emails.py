"""A job with typed args, declared as the README declares it (the typed enqueue examples and the mypy test)."""

from __future__ import annotations

from pydantic import BaseModel

from dygo import JobContext, job


class SendEmail(BaseModel):
    to: str
    subject: str


@job("email.send")
async def send_email(ctx: JobContext, args: SendEmail) -> dict[str, bool]:
    return {"sent": True}
