"""The failed-token throttle: its table (store/auth_state.py, sync and async twins alike), and serve
reading that table only for addresses with failures (app/throttle.py).

Real `dygo serve` processes. Whether a request reads `dygo_auth_failures` is seen by holding an ACCESS
EXCLUSIVE lock on that table: a request that reads it waits for the lock, one that does not answers.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from dygo.app.throttle import ALL_ADDRESSES, LOGIN_ATTEMPTS, PRUNE_EVERY, AuthThrottle
from dygo.store import auth_state

from tests.conftest import ADMIN_TOKEN, TEST_CONFIG, wait_until
from tests.twins import SIDES, Twins

JOB = {"kind": "test.noop"}


@pytest.fixture(params=SIDES)
def state(request, db_url):
    twins = Twins(auth_state, db_url, request.param)
    yield twins
    twins.close()


def _age_failures(conn, address: str, seconds: float) -> None:
    conn.execute(
        "UPDATE dygo_auth_failures SET failures = (SELECT array_agg(t - make_interval(secs => %s) ORDER BY t) "
        "FROM unnest(failures) AS t) WHERE address = %s",
        (seconds, address),
    )


def test_an_address_is_locked_out_after_too_many_failures_until_the_window_passes(conn, state):
    attempts, window = 3, 60.0
    for _ in range(attempts - 1):
        assert state.failed_attempt("10.0.0.1", attempts, window) is None
        _age_failures(conn, "10.0.0.1", 10)  # ten seconds pass
    until = state.failed_attempt("10.0.0.1", attempts, window)
    assert until is not None and abs(until - (time.time() - 20 + window)) < 5  # the first failure leaves then
    assert state.locked_until("10.0.0.1", attempts, window) == (True, until)
    assert state.locked_until("10.0.0.2", attempts, window) == (False, None)  # per address
    _age_failures(conn, "10.0.0.1", 41)  # failures 61, 51 and 41 seconds ago: the oldest left the window
    assert state.locked_until("10.0.0.1", attempts, window) == (True, None)
    until = state.failed_attempt("10.0.0.1", attempts, window)  # failures 51, 41 and 0 seconds ago
    assert until is not None and abs(until - (time.time() - 51 + window)) < 5
    assert conn.execute("SELECT cardinality(failures) FROM dygo_auth_failures").fetchone()[0] == attempts
    state.clear_failures("10.0.0.1")
    assert state.locked_until("10.0.0.1", attempts, window) == (False, None)
    state.failed_attempt("10.0.0.3", attempts, window)
    _age_failures(conn, "10.0.0.3", 61)
    state.failed_attempt("10.0.0.4", attempts, window)  # each failure forgets addresses gone quiet
    assert [row[0] for row in conn.execute("SELECT address FROM dygo_auth_failures")] == ["10.0.0.4"]
    assert state.idle()  # each failure's transaction committed


def test_a_failure_is_notified_with_its_address_unless_the_address_is_too_long_to_send(db_url, state):
    long = "x" * (auth_state.MAX_NOTIFIED_ADDRESS + 1)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {auth_state.AUTH_FAILURE_CHANNEL}")
        state.failed_attempt("10.0.0.5", 3, 60.0)
        state.failed_attempt(long, 3, 60.0)
        assert [n.payload for n in listener.notifies(timeout=0.5)] == ["10.0.0.5"]
    assert state.locked_until(long, 1, 60.0)[1] is not None  # recorded all the same


def caught_up(conn: psycopg.Connection) -> bool:
    """serve's LISTEN connection has subscribed everything (the waiters' LISTEN comes last)."""
    return (
        conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'dygo-serve-listen' AND state = 'idle' "
            "AND query = 'LISTEN dygo_finished'"
        ).fetchone()[0]
        > 0
    )


@contextmanager
def table_locked(db_url: str) -> Iterator[None]:
    with psycopg.connect(db_url) as holder:
        holder.execute("LOCK TABLE dygo_auth_failures IN ACCESS EXCLUSIVE MODE")
        yield
        holder.rollback()


def from_address(address: str, token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"X-Forwarded-For": address, "Authorization": f"Bearer {token}"}  # uvicorn trusts it from 127.0.0.1


def in_background(api, headers: dict[str, str]) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}

    def post() -> None:
        answer["status"] = api.anon.post("/api/v1/jobs", json=JOB, headers=headers, timeout=30).status_code

    thread = threading.Thread(target=post)
    thread.start()
    return thread, answer


def test_a_right_token_from_an_address_without_failures_does_not_read_the_failure_table(serve, conn, db_url):
    api = serve()
    wait_until(lambda: caught_up(conn), message="serve to listen")
    with table_locked(db_url):
        reply = api.anon.post("/api/v1/jobs", json=JOB, headers=from_address("198.51.100.1"), timeout=5)
        assert reply.status_code == 201, reply.text


def test_failures_on_one_process_lock_the_address_out_of_another_at_once(serve, conn, db_url):
    first, second = serve(), serve()
    wait_until(lambda: caught_up(conn), message="serve to listen")
    guesser = "203.0.113.9"
    for n in range(LOGIN_ATTEMPTS):  # every failure on the first process: the second only hears of them
        reply = first.anon.get("/api/v1/queues", headers=from_address(guesser, f"wrong-guess-{n:020d}"))
        assert reply.status_code == (401 if n < LOGIN_ATTEMPTS - 1 else 429), reply.text
    reply = second.anon.post("/api/v1/jobs", json=JOB, headers=from_address(guesser))
    assert reply.status_code == 429, reply.text  # the right token too: guessing must not pay off
    assert reply.json()["error"]["code"] == "too_many_failures"
    assert second.anon.post("/api/v1/jobs", json=JOB, headers=from_address("203.0.113.10")).status_code == 201


def test_an_address_whose_failures_are_cleared_is_no_longer_read(serve, conn, db_url):
    first, second = serve(), serve()
    wait_until(lambda: caught_up(conn), message="serve to listen")
    address = "192.0.2.44"
    assert first.anon.get("/api/v1/queues", headers=from_address(address, "wrong-token-0123456789")).status_code == 401
    # Once the second process hears of the failure it reads the table, finds the address not locked out,
    # clears its failures (a right token forgets them) and stops suspecting it. Until it hears, it admits
    # the right token without a read and the failure stays.

    def cleared_by_second() -> bool:
        assert second.anon.post("/api/v1/jobs", json=JOB, headers=from_address(address)).status_code == 201
        rows = "SELECT count(*) FROM dygo_auth_failures WHERE address <> %s"  # the global budget's row stays
        return conn.execute(rows, (ALL_ADDRESSES,)).fetchone()[0] == 0

    wait_until(cleared_by_second, message="the second process to hear of the failure and clear it")
    with table_locked(db_url):
        assert second.anon.post("/api/v1/jobs", json=JOB, headers=from_address(address), timeout=5).status_code == 201


def test_while_its_listen_connection_is_down_serve_reads_every_token_in_the_failure_table(serve, conn, db_url):
    api = serve()
    wait_until(lambda: caught_up(conn), message="serve to listen")
    with table_locked(db_url):
        # The reconnected listener cannot catch up (reading the table waits for the lock): it is deaf.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'dygo-serve-listen'"
        )
        wait_until(
            lambda: "database connection lost (result LISTEN connection" in api.process.stderr(),
            message="serve to notice",
        )
        thread, answer = in_background(api, from_address("198.51.100.2"))
        thread.join(1.5)
        assert thread.is_alive() and not answer, answer  # waiting for the table, as before this cache
    thread.join(20)
    assert answer["status"] == 201
    wait_until(lambda: caught_up(conn), message="serve to listen again")
    with table_locked(db_url):
        assert (
            api.anon.post("/api/v1/jobs", json=JOB, headers=from_address("198.51.100.2"), timeout=5).status_code == 201
        )


def test_behind_a_transaction_pooler_without_a_direct_url_serve_reads_every_token(serve, conn, db_url):
    # Notifications through such a pooler cannot be relied on (the session is not serve's between
    # transactions): the throttle does not trust them. DYGO_POOL_MODE says so without a pooler.
    api = serve(DYGO_POOL_MODE="transaction")
    wait_until(lambda: caught_up(conn), message="serve to listen")
    with table_locked(db_url):
        thread, answer = in_background(api, from_address("198.51.100.3"))
        thread.join(1.5)
        assert thread.is_alive() and not answer, answer
    thread.join(20)
    assert answer["status"] == 201


def test_suspects_are_forgotten_once_their_window_has_passed():
    throttle = AuthThrottle(state=None, window=0.05)
    for n in range(PRUNE_EVERY - 1):
        throttle.suspect(f"10.0.{n // 256}.{n % 256}")
    assert throttle._suspect("10.0.0.1")
    time.sleep(0.1)
    # Its newest failure is older than the window: it cannot be locked out, so it is not read.
    assert not throttle._suspect("10.0.0.1")
    throttle.suspect("192.0.2.1")  # every PRUNE_EVERY failures heard of, the stale ones are swept
    assert list(throttle.suspects) == ["192.0.2.1"]


def throttled_serve(serve, tmp_path, extra: str):
    shutil.copy(TEST_CONFIG / "queues.yml", tmp_path / "queues.yml")
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + extra)
    return serve(DYGO_CONFIG_DIR=str(tmp_path))


def status_from(api, address: str, token: str) -> int:
    """The status of a GET with `token` from `address`."""
    return api.anon.get("/api/v1/queues", headers=from_address(address, token)).status_code


def test_wrong_tokens_spread_over_many_addresses_spend_a_global_budget_not_a_working_client(serve, conn, tmp_path):
    api = throttled_serve(serve, tmp_path, "failed_token_global_limit: 20\n")
    assert status_from(api, "10.1.0.1", ADMIN_TOKEN) == 200  # a client at work before the guessing
    statuses = [status_from(api, f"10.2.{i // 250}.{i % 250 + 1}", "wrong-token-" + "x" * 30) for i in range(60)]
    assert statuses.count(401) == 20 and statuses.count(429) == 40, statuses
    # Guessing from a fresh address gets nothing, the right token included; the working client keeps working.
    assert status_from(api, "10.3.0.1", ADMIN_TOKEN) == 429
    assert status_from(api, "10.1.0.1", ADMIN_TOKEN) == 200
    # Refused guesses are not written: one row per address that got a guess in, and the budget's.
    assert conn.execute("SELECT count(*) FROM dygo_auth_failures").fetchone()[0] <= 21


def test_ipv6_clients_are_counted_by_their_64_network(serve, tmp_path):
    api = throttled_serve(serve, tmp_path, "")
    for host in range(1, LOGIN_ATTEMPTS + 1):
        assert status_from(api, f"2001:db8:0:1::{host:x}", "wrong-token-" + "y" * 30) in (401, 429)
    assert status_from(api, "2001:db8:0:1:ffff:ffff:ffff:abcd", ADMIN_TOKEN) == 429  # the same /64
    assert status_from(api, "2001:db8:0:2::1", ADMIN_TOKEN) == 200  # another /64
