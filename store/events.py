"""Events: `ctx.wait_for_event` suspends a job until `emit` (or the API, or a signed callback URL) emits its key.

An event is a key ("order:42") and a JSON payload. The first emit of a key wins: its payload is kept, and a
later emit of the key changes nothing and wakes nobody (Emitted.duplicate). An emit runs in the caller's
transaction (two statements, sent in one round trip): nothing of it is seen, and nobody wakes, unless that
transaction commits.

A wait is a step (`name#n`, store/steps.py). Its first run reads the event: emitted already, the step is
recorded done with the payload and the run goes on. Not emitted, the run ends with Suspended, and the settle
that moves the job to `waiting` (no slot, no connection, its attempt not spent) records the step `waiting`
with its deadline, in its own transaction, holding the event's row FOR SHARE from before it takes the job's
row (store/sql/events.py tells the lock order). An emit takes that row exclusively, then marks done (with the
payload) every wait for the key whose deadline has not passed and moves their jobs to `pending`. Whichever of
the two comes second sees what the first did, so no wake-up is lost: an emit racing a wait's settle either
wakes the recorded wait or is seen by the settle, which records the wait done and the job pending at once.
The settle waits for an emit in flight at most 50 ms (it holds the worker's one shared connection); past
that it records no wait, and the job runs again RECHECK_DELAY later and reads the event then (`recheck`).

The run after the wake replays the job's steps; the wait returns the payload (JSON-decoded) without waiting
again. A wait whose deadline passes is timed out by a worker's sweep (worker/event_timeouts.py, every
second), and its replay raises EventTimeout, which the handler may catch.

A callback URL (`callback_url`) lets a third party emit one key through `dygo serve` without an API token: it
carries an HMAC-SHA256 of the key made with DYGO_SECRET_KEY, which serve and the processes making the URLs
must share. Retention deletes events (and the placeholders of waits) older than `event_retention`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg
from dygo.store.db import aroll_back, one, roll_back
from dygo.store.durations import parse_duration
from dygo.store.errors import CodedError, ConfigError, EventError, EventTimeout, LeaseLost, StepError, Suspended
from dygo.store.leases import Outcome, Unsuccessful, Wait, on_indexes
from dygo.store.sql import events as sql
from dygo.store.sql import steps as steps_sql
from psycopg.pq import TransactionStatus

if TYPE_CHECKING:
    from dygo.store.steps import Steps

log = logging.getLogger("dygo.worker")

MAX_KEY = 200  # characters of an event key
MAX_PAYLOAD_BYTES = 1024 * 1024  # of an event's payload as JSON: it becomes the waits' step result
SECRET_ENV = "DYGO_SECRET_KEY"  # the key of callback URLs' signatures (and of the dashboard's cookies)
CALLBACK_PATH = "/api/v1/events/{key}/callback"
SWEEP_BATCH = 1000  # waits timed out per sweep statement


@dataclass(frozen=True, slots=True)
class Emitted:
    woken: int  # jobs moved from waiting to pending
    duplicate: bool  # an earlier emit of the key won: nothing changed, nobody woken


# --- the rules --------------------------------------------------------------------------------------


# What check_key allows, as a pattern for the API's document: no '/' and no control character.
KEY_PATTERN = r"^[^/\x00-\x1f\x7f]+$"


def check_key(key: Any, field: str = "key") -> str:
    """An event key: a non-empty string of at most MAX_KEY characters, without '/' or control characters (it
    is a URL path segment of the API). EventError naming `field` otherwise."""
    if not isinstance(key, str) or not key:
        raise EventError(field, f"an event key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY:
        raise EventError(field, f"an event key has at most {MAX_KEY} characters, got {len(key)}")
    if not re.fullmatch(KEY_PATTERN, key):
        raise EventError(field, f"an event key may not contain '/' or control characters, got {key!r}")
    return key


def encode_payload(payload: Any) -> str | None:
    """An event's payload as the JSON stored (None for null), or EventError naming `payload`."""
    if payload is None:
        return None
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EventError("payload", f"must be JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise EventError("payload", "contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    if len(text) > MAX_PAYLOAD_BYTES:
        raise EventError("payload", f"{len(text)} bytes of JSON is more than the {MAX_PAYLOAD_BYTES} an event takes")
    return text


def timeout_seconds(timeout: Any) -> float | None:
    """A wait's timeout in seconds: None (no timeout), a duration ("3d", "90s"), seconds or a timedelta."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    try:
        return parse_duration(timeout, field="timeout")
    except ValueError as exc:
        raise EventError("timeout", str(exc).removeprefix("timeout: ")) from None


# --- emitting ---------------------------------------------------------------------------------------


def emit(conn: psycopg.Connection[Any], key: str, payload: Any = None) -> Emitted:
    """Emit the event `key` with `payload` (JSON) in `conn`'s transaction: it counts once that transaction
    commits (an autocommit connection outside a transaction: in one of its own, at once). The first emit of a
    key wins. The transaction must be READ COMMITTED (PostgreSQL's default; EventError otherwise, and the
    transaction must then roll back); emit several keys in one transaction in sorted order. One round trip."""
    params = {"event": check_key(key), "payload": encode_payload(payload)}
    own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    try:
        with conn.pipeline():
            if own:
                conn.execute(sql.BEGIN_READ_COMMITTED)
            emitted = conn.execute(sql.EMIT_EVENT, params)
            woken = conn.execute(sql.WAKE_WAITERS, params)
            if own:
                conn.execute(sql.COMMIT)
    except BaseException:
        if own:
            roll_back(conn)
        raise
    return _emitted(emitted.fetchone(), woken.fetchone())


async def aemit(conn: psycopg.AsyncConnection[Any], key: str, payload: Any = None) -> Emitted:
    """`emit` on an async connection."""
    params = {"event": check_key(key), "payload": encode_payload(payload)}
    own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    try:
        async with conn.pipeline():
            if own:
                await conn.execute(sql.BEGIN_READ_COMMITTED)
            emitted = await conn.execute(sql.EMIT_EVENT, params)
            woken = await conn.execute(sql.WAKE_WAITERS, params)
            if own:
                await conn.execute(sql.COMMIT)
    except BaseException:
        if own:
            await aroll_back(conn)
        raise
    return _emitted(await emitted.fetchone(), await woken.fetchone())


def _emitted(emitted: Any, woken: Any) -> Emitted:
    first, isolation = one(emitted)
    if isolation != "read committed":
        raise EventError(
            "transaction",
            f"an emit needs a READ COMMITTED transaction (it must see the waits committed while it waited for "
            f"the event's row), not {isolation.upper()}; roll this one back",
        )
    return Emitted(int(one(woken)[0]), not first)


# --- callback URLs ----------------------------------------------------------------------------------


class CallbackRefused(CodedError):
    """A callback URL whose signature does not match its key, or a server without DYGO_SECRET_KEY (403)."""

    http_status = 403


def _secret() -> bytes | None:
    configured = os.environ.get(SECRET_ENV)
    return configured.encode() if configured else None


def callback_signature(key: str, secret: bytes) -> str:
    """The signature of a callback URL for `key`: HMAC-SHA256 under a key derived from `secret` for this use
    alone (a dashboard cookie's signature is never a callback's), base64url without padding."""
    derived = hmac.new(secret, b"dygo.events.callback", hashlib.sha256).digest()
    digest = hmac.new(derived, key.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def callback_url(key: str, base_url: str = "") -> str:
    """A URL that emits `key` when POSTed to (its JSON body the payload), with no API token: the path, after
    `base_url` ("https://jobs.example.com") when given. ConfigError when DYGO_SECRET_KEY is not set."""
    event = check_key(key)
    secret = _secret()
    if secret is None:
        raise ConfigError(
            SECRET_ENV,
            "environment",
            "callback URLs are signed with it: set it, to the same value, for dygo serve and for every process "
            "that makes callback URLs",
        )
    path = CALLBACK_PATH.format(key=quote(event, safe=":@"))
    return f"{base_url.rstrip('/')}{path}?sig={callback_signature(event, secret)}"


def check_callback(key: str, signature: str) -> None:
    """CallbackRefused unless `signature` is `key`'s under DYGO_SECRET_KEY (compared in constant time)."""
    secret = _secret()
    if secret is None:
        raise CallbackRefused(
            "callbacks_disabled",
            f"callback URLs are off on this server: {SECRET_ENV} is not set (it must be the one the URL was made with)",
        )
    expected = callback_signature(key, secret).encode()
    if not hmac.compare_digest(signature.encode("utf-8", "surrogateescape"), expected):
        raise CallbackRefused(
            "bad_signature",
            "the callback URL's signature does not match its event key: use the URL exactly as "
            f"dygo.callback_url made it, with the server's {SECRET_ENV}",
        )


# --- a handler's wait (ctx.wait_for_event) ------------------------------------------------------------


async def wait_for_event(steps: Steps, name: str, key: str, timeout: Any) -> Any:
    """The wait `name#n` of one run (JobContext.wait_for_event): the event's payload, EventTimeout, or
    Suspended until the event comes."""
    step, seq = steps._next(name)
    event = check_key(key)
    seconds = timeout_seconds(timeout)
    stored = await steps._stored()
    if step in stored:
        recorded = stored[step]
        payload = steps._replayed(step, seq, stored)
        if recorded.state == "done":
            return payload
        if recorded.state == "timed_out":
            raise EventTimeout(step, event, seconds)
        if recorded.state != "waiting":
            raise StepError(step, "recorded as another kind of step, not an event wait: they cannot share a name")
        raise _suspended(steps, step, seq, event, seconds)  # run before its wait ended (a retry): wait again
    steps._check_new(step, seq)
    lease = steps.lease
    params = {
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        "key": step,
        "seq": seq,
        "attempt": lease.attempt,
        "event": event,
    }
    async with steps.connect() as conn:
        cursor = await conn.execute(sql.RECORD_EMITTED, params)
        leased, emitted, recorded_now, payload_text = one(await cursor.fetchone())
        if not leased:
            raise LeaseLost(lease.job_id, step)
        if emitted and not recorded_now:  # the key was recorded meanwhile: the first record wins
            cursor = await conn.execute(steps_sql.STEP_RESULT, {"job_id": lease.job_id, "key": step})
            payload_text = one(await cursor.fetchone())[0]
    if emitted:
        return None if payload_text is None else json.loads(payload_text)
    raise _suspended(steps, step, seq, event, seconds)


def _suspended(steps: Steps, step: str, seq: int, event: str, seconds: float | None) -> Suspended:
    lease = steps.lease
    params = {
        "job_id": lease.job_id,
        "key": step,
        "seq": seq,
        "attempt": lease.attempt,
        "event": event,
        "timeout": seconds,
    }
    reason = f"event {event!r}"
    return Suspended(step, reason, Wait(reason, sql.RECORD_WAIT, params, lock=sql.LOCK_EVENT, lock_key=event))


# --- a settle that could not take an event's row -------------------------------------------------------

RECHECK_DELAY = 1.0  # seconds before a run whose wait met an emit in flight checks the event again


def recheck(outcomes: list[Outcome]) -> list[Outcome] | None:
    """The batch of a settle that failed with lock_not_available (dygo_lock_event gave up waiting for an
    event's row that an emit's transaction holds), its event waits made rechecks: pending in RECHECK_DELAY,
    the attempt refunded, nothing recorded, so the job runs again and reads the event then. None when the
    batch has no event wait (the error came from elsewhere)."""
    changed = False
    again: list[Outcome] = []
    for outcome in outcomes:
        if isinstance(outcome, Unsuccessful) and outcome.wait is not None and outcome.wait.lock == sql.LOCK_EVENT:
            outcome = Unsuccessful(
                outcome.job, "pending", delay=RECHECK_DELAY, refund_attempt=True, progress=outcome.progress
            )
            changed = True
        again.append(outcome)
    if changed:
        log.info("event waits met an emit of their key in flight: their jobs read it again in %gs", RECHECK_DELAY)
    return again if changed else None


# --- the worker's timeout sweep -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimedOut:
    waits: int  # waits timed out
    woken: int  # of their jobs, those moved from waiting to pending


async def time_out_waits(conn: psycopg.AsyncConnection[Any]) -> TimedOut:
    """Time out at most SWEEP_BATCH waits whose deadline has passed, and move their jobs to pending. On the
    indexes only: planned while dygo_jobs was small, its job lookups would otherwise read the table whole."""
    cursor = await on_indexes(conn, sql.TIME_OUT_WAITS, {"batch": SWEEP_BATCH})
    waits, woken = one(await cursor.fetchone())
    return TimedOut(int(waits), int(woken))
