"""Django: enqueue joins `transaction.atomic()`, and `manage.py dygo worker` runs the apps' jobs.

A real Django project (tests/django_project) on the module's test database: its view in-process
through Django's test client, its worker as a real `manage.py dygo worker` process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dygo import UnsupportedConnection, aenqueue, enqueue

pytestmark = pytest.mark.shared_database

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def django_project(module_db_url: str) -> Iterator[None]:
    """Django set up on the module's database (its settings read DATABASE_URL once), the shop's table made."""
    saved = {name: os.environ.get(name) for name in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    os.environ.update(DATABASE_URL=module_db_url, DJANGO_SETTINGS_MODULE="tests.django_project.settings")
    import django
    from django.db import connection

    django.setup()
    from tests.django_project.shop.models import Order

    with connection.schema_editor() as editor:
        editor.create_model(Order)
    yield
    connection.close()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def ship_jobs(conn: psycopg.Connection) -> list[tuple[int, str]]:
    rows = conn.execute("SELECT (args->>'order_id')::int, state FROM dygo_jobs WHERE kind = 'shop.ship' ORDER BY id")
    return rows.fetchall()


def orders(email: str) -> list[int]:
    from tests.django_project.shop.models import Order

    return list(Order.objects.filter(email=email).values_list("id", flat=True))


def test_view_commits_the_order_and_its_job_in_one_atomic_block(conn):
    from django.test import Client

    reply = Client().post("/orders", {"email": "paid@example.com"})
    assert reply.status_code == 201
    order_id = reply.json()["order"]
    assert orders("paid@example.com") == [order_id]
    assert (order_id, "pending") in ship_jobs(conn)


def test_rolled_back_atomic_block_leaves_neither_order_nor_job(conn):
    from django.test import Client

    before = ship_jobs(conn)
    reply = Client().post("/orders", {"email": "sold-out@example.com", "sku": "sold-out"})
    assert reply.status_code == 409
    assert orders("sold-out@example.com") == []
    assert ship_jobs(conn) == before


def test_outside_atomic_the_job_commits_on_its_own_as_a_django_write_does(conn):
    from django.db import connection

    job = enqueue(connection, "shop.ship", {"order_id": -1})
    assert conn.execute("SELECT kind FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone() == ("shop.ship",)


def test_a_database_other_than_postgresql_is_refused():
    from django.db import connections

    with pytest.raises(UnsupportedConnection, match="'legacy' is sqlite: dygo needs PostgreSQL"):
        enqueue(connections["legacy"], "shop.ship", {"order_id": 1})


def test_aenqueue_with_a_django_connection_says_to_call_enqueue():
    from django.db import connection

    with pytest.raises(UnsupportedConnection, match="call enqueue, not aenqueue"):
        asyncio.run(aenqueue(connection, "shop.ship", {"order_id": 1}))


def test_database_url_comes_from_databases(module_db_url):
    from dygo.contrib.django import database_url

    with psycopg.connect(database_url()) as conn:
        assert conn.info.dbname == psycopg.conninfo.conninfo_to_dict(module_db_url)["dbname"]


def test_manage_py_dygo_worker_runs_an_app_job_through_the_orm(conn, module_db_url):
    from django.db import connection

    from tests.django_project.shop.jobs import Ship, ship
    from tests.django_project.shop.models import Order

    order = Order.objects.create(email="ship-me@example.com")
    job = ship.enqueue(connection, Ship(order_id=order.id), priority=1000)  # first in `--once`'s batch
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_")}
    env.update(DATABASE_URL=module_db_url, PYTHONPATH=str(REPO))
    manage = [sys.executable, "tests/django_project/manage.py", "dygo", "worker", "--once", "--queue", "default"]
    worker = subprocess.run(manage, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 0, worker.stderr
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone() == ("succeeded",)
    order.refresh_from_db()
    assert order.shipped


def test_a_keyed_batch_joins_the_atomic_block_and_its_rollback(conn):
    from django.db import connection, transaction

    from tests.django_project.shop.jobs import Ship, ship

    before = ship_jobs(conn)
    with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012 - the block is the behaviour
        ship.enqueue_many(connection, [Ship(order_id=-2), Ship(order_id=-3)], idempotency_key="batch-in-atomic")
        assert len(ship_jobs(conn)) == len(before)  # not visible outside the block
        raise RuntimeError("roll back")
    assert ship_jobs(conn) == before
    with transaction.atomic():
        results = ship.enqueue_many(connection, [Ship(order_id=-4), Ship(order_id=-5)], idempotency_key="kept")
    assert [r.deduplicated for r in results] == [False, True]
    assert (-4, "pending") in ship_jobs(conn)
