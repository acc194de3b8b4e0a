"""SQLAlchemy 2 with dygo, as docs/guides/sqlalchemy.md shows it (run by tests/test_sqlalchemy.py)."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dygo import JobContext, job


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


# --8<-- [start:job]
class Receipt(BaseModel):
    order_id: int
    email: str


@job("shop.send_receipt")
async def send_receipt(ctx: JobContext, args: Receipt) -> None: ...


# --8<-- [end:job]


# --8<-- [start:session]
def place_order(session: Session, email: str) -> Order:
    """Write the order and enqueue its receipt in the session's transaction: both commit, or neither."""
    order = Order(email=email)
    session.add(order)
    session.flush()  # the order's id
    send_receipt.enqueue(session, Receipt(order_id=order.id, email=email))
    return order


# --8<-- [end:session]


# --8<-- [start:async-session]
async def aplace_order(session: AsyncSession, email: str) -> Order:
    order = Order(email=email)
    session.add(order)
    await session.flush()
    await send_receipt.aenqueue(session, Receipt(order_id=order.id, email=email))
    return order


# --8<-- [end:async-session]
