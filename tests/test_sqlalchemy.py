"""SQLAlchemy 2: enqueue through a Session, Connection, AsyncSession or AsyncConnection joins its transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from dygo import UnsupportedConnection, enqueue
from tests.examples.sqlalchemy_orders import Base, Order, aplace_order, place_order

pytestmark = pytest.mark.shared_database


@pytest.fixture(scope="module")
def engine(module_db_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(module_db_url))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def sqlalchemy_url(db_url: str, driver: str = "psycopg") -> URL:
    """The test database as a SQLAlchemy URL on `driver` (its server listens on a Unix socket: `?host=`)."""
    params = conninfo_to_dict(db_url)
    url = URL.create(f"postgresql+{driver}", username=str(params["user"]), database=str(params["dbname"]))
    return url.update_query_dict({"host": str(params["host"])})


def async_engine(db_url: str, driver: str = "psycopg") -> AsyncEngine:
    return create_async_engine(sqlalchemy_url(db_url, driver))


def receipts_for(conn: psycopg.Connection, email: str) -> list[int]:
    rows = conn.execute("SELECT (args->>'order_id')::int FROM dygo_jobs WHERE args->>'email' = %s", (email,))
    return [order_id for (order_id,) in rows]


def orders_for(engine: Engine, email: str) -> list[int]:
    with Session(engine) as session:
        return list(session.scalars(select(Order.id).where(Order.email == email)))


def test_session_commits_the_order_and_its_job_together(engine, conn):
    with Session(engine) as session:
        order_id = place_order(session, "committed@example.com").id
        assert receipts_for(conn, "committed@example.com") == []  # not before the commit
        session.commit()
    assert receipts_for(conn, "committed@example.com") == [order_id] == orders_for(engine, "committed@example.com")


def test_session_rolled_back_leaves_neither_order_nor_job(engine, conn):
    with Session(engine) as session:
        place_order(session, "rolled-back@example.com")
        session.rollback()
    assert receipts_for(conn, "rolled-back@example.com") == [] == orders_for(engine, "rolled-back@example.com")


def test_connection_enqueues_inside_its_transaction(engine, conn):
    with pytest.raises(RuntimeError), engine.begin() as connection:
        enqueue(connection, "shop.send_receipt", {"order_id": 1, "email": "conn@example.com"})
        assert connection.execute(text("SELECT count(*) FROM dygo_jobs WHERE args->>'email' = 'conn@example.com'"))
        raise RuntimeError("roll back")
    assert receipts_for(conn, "conn@example.com") == []
    with engine.connect() as connection:  # no transaction begun yet: enqueue begins it, commit ends it
        enqueue(connection, "shop.send_receipt", {"order_id": 2, "email": "conn@example.com"})
        connection.commit()
    assert receipts_for(conn, "conn@example.com") == [2]


def test_async_session_commits_or_rolls_back_with_the_job(engine, module_db_url, conn):
    async def go() -> int:
        engine = async_engine(module_db_url)
        try:
            async with AsyncSession(engine) as session:
                await aplace_order(session, "async-rolled-back@example.com")
                await session.rollback()
            async with AsyncSession(engine) as session:
                order_id = (await aplace_order(session, "async@example.com")).id
                await session.commit()
            async with engine.connect() as connection:
                await enqueue_through(connection)
                await connection.commit()
            return order_id
        finally:
            await engine.dispose()

    async def enqueue_through(connection) -> None:
        from tests.examples.sqlalchemy_orders import Receipt, send_receipt

        await send_receipt.aenqueue(connection, Receipt(order_id=3, email="async-conn@example.com"))

    order_id = asyncio.run(go())
    assert receipts_for(conn, "async@example.com") == [order_id] == orders_for(engine, "async@example.com")
    assert (
        receipts_for(conn, "async-rolled-back@example.com") == [] == orders_for(engine, "async-rolled-back@example.com")
    )
    assert receipts_for(conn, "async-conn@example.com") == [3]


def test_asyncpg_engine_is_refused_with_the_fix_named(engine, module_db_url):
    async def go() -> None:
        engine = async_engine(module_db_url, driver="asyncpg")
        try:
            async with AsyncSession(engine) as session:
                await aplace_order(session, "asyncpg@example.com")
        finally:
            await engine.dispose()

    with pytest.raises(UnsupportedConnection, match=r"postgresql\+asyncpg.*not psycopg 3.*'postgresql\+psycopg://"):
        asyncio.run(go())


def test_sync_and_async_sessions_handed_to_the_wrong_twin_are_refused_with_the_fix_named(engine, module_db_url):
    from dygo import aenqueue

    args = {"order_id": 1, "email": "x@example.com"}
    with Session(engine) as session, pytest.raises(UnsupportedConnection, match="use enqueue with it"):
        asyncio.run(aenqueue(session, "shop.send_receipt", args))
    with pytest.raises(UnsupportedConnection, match=r"use `await aenqueue\(...\)` with it"):
        enqueue(AsyncSession(async_engine(module_db_url)), "shop.send_receipt", args)


def test_an_engine_on_another_database_is_refused(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    with Session(engine) as session, pytest.raises(UnsupportedConnection, match=r"sqlite\+pysqlite.*not psycopg 3"):
        enqueue(session, "shop.send_receipt", {"order_id": 1, "email": "x@example.com"})


def test_a_workflow_joins_the_session_transaction(engine, conn):
    from dygo import chain, enqueue_workflow

    def receipt(order_id: int) -> tuple[str, str, dict]:
        return (f"r{order_id}", "shop.send_receipt", {"order_id": order_id, "email": "workflow@example.com"})

    with Session(engine) as session:
        enqueue_workflow(session, chain("sa-rolled-back", receipt(1), receipt(2)))
        session.rollback()
    with Session(engine) as session:
        enqueue_workflow(session, chain("sa-committed", receipt(3), receipt(4)))
        session.commit()
    names = [name for (name,) in conn.execute("SELECT name FROM dygo_workflows WHERE name LIKE 'sa-%'")]
    assert names == ["sa-committed"]
    assert sorted(receipts_for(conn, "workflow@example.com")) == [3, 4]
