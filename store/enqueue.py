"""Enqueue jobs: one, many (COPY), or inside the caller's own transaction (outbox pattern).

Pass a psycopg connection. In autocommit mode each call commits on its own; inside
`with conn.transaction():` (or on a connection out of autocommit) the jobs commit, and wake workers,
only with the caller's writes. `enqueue` / `enqueue_many` take a sync `psycopg.Connection`;
`aenqueue` / `aenqueue_many` an `AsyncConnection`. A Django connection or a SQLAlchemy session or
connection works too, in its own transaction (store/connections.py).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import psycopg
from dygo.store import tracing
from dygo.store.config import KEBAB_CASE
from dygo.store.connections import (
    Connectable,
    ajoined_transaction,
    async_connection,
    joined_transaction,
    sync_connection,
)
from dygo.store.db import one
from dygo.store.durations import parse_duration
from dygo.store.errors import EnqueueConflict, EnqueueError
from dygo.store.registry import KIND_PATTERN, MAX_KIND_LENGTH, Registry, registry
from dygo.store.sql import enqueue as sql

PRIORITY_RANGE = (-1000, 1000)
ATTEMPTS_RANGE = (1, 1000)  # max_attempts
MAX_KEY_LENGTH = 255
# PostgreSQL text and jsonb cannot hold a NUL character, and UTF-8 cannot encode an unpaired surrogate:
# refused here with the field named, instead of failing inside the driver or the server.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
NO_TRACE: Mapping[str, str] = MappingProxyType({})  # prepare's trace while tracing is off


@dataclass(frozen=True)
class Enqueued:
    id: int
    deduplicated: bool
    run_at: datetime | None


@dataclass
class JobRequest:
    """One job to enqueue, with every option. Validated into a row by `prepare`."""

    kind: str
    args: Any = None
    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: str | float | timedelta | None = None
    max_attempts: int | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    idempotency_ttl: str | float | timedelta | None = None


def prepare(request: JobRequest, jobs: Registry = registry, trace: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The row parameters for `request`, or EnqueueError naming the bad field and the rule.

    `trace`: the trace context to carry in the meta (tracing.carrier()); None takes the current one.
    """
    definition = jobs.get(request.kind)
    if definition is not None and definition.args_model is None and type(request.args) is dict and _plain(request):
        # The usual job (a registered kind without an args model, its args a dict, no option set): the row
        # the general path below gives it, without walking the options it does not have.
        context = tracing.carrier() if trace is None else trace
        _check_queue(definition.queue_name, jobs)
        return {
            "kind": request.kind,
            "queue": definition.queue_name,
            "args": _dump("args", request.args),
            "meta": _meta_json(None, context) if context else "{}",
            "priority": _priority(definition.priority),
            "run_at": None,
            "delay": 0.0,
            "max_attempts": None,
            "key": None,
            "ttl": None,
        }
    queue = request.queue
    if definition is None:
        if queue is None:
            raise EnqueueError(
                "unknown_kind",
                f"kind {request.kind!r} is not registered; known kinds: {', '.join(jobs.kinds()) or 'none'}",
            )
        args = request.args.model_dump(mode="json") if hasattr(request.args, "model_dump") else request.args
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise EnqueueError("invalid_args", "args must be a JSON object")
    else:
        args = definition.validate_args(request.args)
        queue = queue or definition.queue_name
    # A registered kind matches KIND_PATTERN already; another must too (checked per job, so a batch of known
    # kinds skips the match): a kind is a metrics label, a log field and a dashboard heading.
    if definition is None:
        _check_kind(request.kind)
    _check_queue(queue, jobs)
    args_json = _dump("args", args)

    priority = _priority(
        request.priority if request.priority is not None else (definition.priority if definition else 0)
    )
    # Unset stays NULL: the claiming worker gives the kind's registered max_attempts (or the configured
    # default) at the first lease, so a producer that does not import the kind cannot stamp the wrong one.
    max_attempts = request.max_attempts
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not ATTEMPTS_RANGE[0] <= max_attempts <= ATTEMPTS_RANGE[1]
    ):
        raise EnqueueError(
            "invalid_option",
            f"max_attempts must be an integer from {ATTEMPTS_RANGE[0]} to {ATTEMPTS_RANGE[1]}, got {max_attempts!r}",
        )

    if request.run_at is not None and request.delay is not None:
        raise EnqueueError("invalid_option", "give run_at or delay, not both")
    if request.run_at is not None and (not isinstance(request.run_at, datetime) or request.run_at.tzinfo is None):
        raise EnqueueError("invalid_timestamp", "run_at must be a datetime with a timezone")
    run_at = request.run_at
    if run_at is not None:
        try:
            # In UTC: PostgreSQL takes offsets up to ±15:59 only, ISO 8601 up to ±23:59.
            run_at = run_at.astimezone(UTC)
        except OverflowError:
            raise EnqueueError(
                "invalid_timestamp", f"run_at {run_at.isoformat()} is outside years 1 to 9999 in UTC"
            ) from None
    delay = _seconds(request.delay, "delay") if request.delay is not None else 0.0

    if request.meta is not None and not isinstance(request.meta, Mapping):
        raise EnqueueError("invalid_option", "meta must map strings to strings")
    context = tracing.carrier() if trace is None else trace  # the parent of the handler's span
    meta_json = _meta_json(request.meta, context) if request.meta or context else "{}"

    key = request.idempotency_key
    if key is not None:
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
            raise EnqueueError(
                "invalid_option", f"idempotency_key must be a string of 1 to {MAX_KEY_LENGTH} characters"
            )
        _refuse_unstorable("idempotency_key", key)
    ttl = None
    if request.idempotency_ttl is not None:
        if key is None:
            raise EnqueueError("invalid_option", "idempotency_ttl needs an idempotency_key")
        ttl = _seconds(request.idempotency_ttl, "idempotency_ttl")
        if ttl <= 0:
            raise EnqueueError("invalid_duration", "idempotency_ttl must be greater than 0")

    return {
        "kind": request.kind,
        "queue": queue,
        "args": args_json,
        "meta": meta_json,
        "priority": priority,
        "run_at": run_at,
        "delay": delay,
        "max_attempts": max_attempts,
        "key": key,
        "ttl": ttl,
    }


def _plain(request: JobRequest) -> bool:
    """No option set: every field but the kind and the args at its default."""
    return (
        request.queue is None
        and request.priority is None
        and request.run_at is None
        and request.delay is None
        and request.max_attempts is None
        and not request.meta
        and request.idempotency_key is None
        and request.idempotency_ttl is None
    )


def _priority(priority: Any) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not (PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1])
    ):
        raise EnqueueError(
            "invalid_option",
            f"priority must be an integer from {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}, got {priority!r}",
        )
    return priority


def _check_queue(queue: Any, jobs: Registry) -> None:
    """EnqueueError unless `queue` is a configured queue: no worker could ever run a job of another. Holds
    for a producer that never loaded the configuration too (the registry then reads config/queues.yml)."""
    configured = jobs.queues
    if configured is not None and queue in configured:
        return  # the hot path: one lookup in a short list
    if not isinstance(queue, str) or not KEBAB_CASE.match(queue):
        raise EnqueueError(
            "unknown_queue",
            f"queue {queue!r} is not configured, nor can it be: queue names are "
            "kebab-case (lowercase letters, digits and dashes, like 'email' or 'slow-imports')",
            {"field": "queue"},
        )
    configured = jobs.configured_queues()
    if queue not in configured:
        raise EnqueueError(
            "unknown_queue", f"queue {queue!r} is not configured; queues: {', '.join(configured)}", {"field": "queue"}
        )


def _meta_json(meta: Mapping[str, str] | None, context: Mapping[str, str]) -> str:
    entries = dict(meta or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise EnqueueError("invalid_option", "meta must map strings to strings")
    entries.update(context)
    return _dump("meta", entries)


def _dump(name: str, value: Any) -> str:
    """`value` as JSON text, or EnqueueError when it holds a character PostgreSQL cannot store."""
    text = json.dumps(value)
    # The JSON escapes every such character (NUL as \u0000, a surrogate as \ud800 to \udfff), so the walk
    # that names the field only runs when the text holds one (or an emoji's surrogate pair).
    if "\\u0000" in text or "\\ud" in text:
        _refuse_unstorable(name, value)
    return text


def _check_kind(kind: Any) -> None:
    if not isinstance(kind, str) or len(kind) > MAX_KIND_LENGTH or not KIND_PATTERN.match(kind):
        shown = (
            repr(kind) if not isinstance(kind, str) or len(kind) <= 60 else f"{kind[:60]!r}... ({len(kind)} characters)"
        )
        raise EnqueueError(
            "invalid_kind",
            f"kind {shown} must be a dotted name like 'email.send' (letters, digits and '_', parts joined by "
            f"'.' or '-') of at most {MAX_KIND_LENGTH} characters",
        )


def _refuse_unstorable(name: str, value: Any) -> None:
    """EnqueueError when a string anywhere in `value` (keys included) holds a character PostgreSQL cannot store."""
    pending: list[tuple[str, Any]] = [(name, value)]
    while pending:  # a loop, not recursion: args may nest deeper than Python's recursion limit
        where, item = pending.pop()
        if isinstance(item, str):
            found = UNSTORABLE.search(item)
            if found:
                raise EnqueueError(
                    "invalid_value",
                    f"{where} holds {ascii(found.group())} (a NUL character or an "
                    "unpaired surrogate), which PostgreSQL cannot store",
                    {"field": where},
                )
        elif isinstance(item, Mapping):
            for key, child in item.items():
                pending.append((f"{where} key", key))
                pending.append((f"{where}[{key!a}]", child))
        elif isinstance(item, list | tuple):
            pending.extend((f"{where}[{i}]", child) for i, child in enumerate(item))


def _seconds(value: str | float | timedelta, name: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        return parse_duration(value, field=name)
    except ValueError as exc:
        raise EnqueueError("invalid_duration", str(exc)) from None


def _requests(jobs: Sequence[JobRequest | Mapping[str, Any]]) -> list[JobRequest]:
    return [job if isinstance(job, JobRequest) else JobRequest(**job) for job in jobs]


def _single_statement(row: dict[str, Any]) -> tuple[str, str | None]:
    """The insert for one row, and the lookup that finds the job a deduplicated insert met."""
    if row["ttl"] is not None:
        return sql.INSERT_JOB_UNLESS_WINDOW_KEY, sql.JOB_BY_WINDOW_KEY
    if row["key"] is not None:
        return sql.INSERT_JOB_UNLESS_LIVE_KEY, sql.LIVE_JOB_BY_KEY
    return sql.INSERT_JOB, None


def copy_row(job_id: int, row: dict[str, Any], db_now: datetime) -> tuple[Any, ...]:
    """A prepared row as COPY_JOBS takes it (store/workflows.py adds its state and node after)."""
    run_at = row["run_at"] or db_now + timedelta(seconds=row["delay"])
    return (job_id, row["kind"], row["queue"], row["args"], row["meta"], row["priority"], run_at, row["max_attempts"])


def _keyed_params(ids: list[int], rows: list[dict[str, Any]], db_now: datetime) -> dict[str, list[Any]]:
    copied = [copy_row(job_id, row, db_now) for job_id, row in zip(ids, rows, strict=True)]
    columns = list(zip(*copied, strict=True))
    names = ["ids", "kinds", "queues", "args", "metas", "priorities", "run_ats", "max_attempts"]
    params = {name: list(values) for name, values in zip(names, columns, strict=True)}
    params["keys"] = [row["key"] for row in rows]
    return params


# --- shared by the blocking and the async twins below: everything but the I/O -------------------------

# Up to this many rows without keys go in one INSERT ... unnest statement (one round trip); more, or any
# keyed row, take the transaction with COPY (four round trips, cheaper per row for big batches).
PLAIN_BATCH_MAX = 1000


@functools.lru_cache(maxsize=4096)
def _quoted(name: str) -> str:
    return json.dumps(name)  # kinds and queues: a few distinct names, quoted once


def rows_json(rows: list[dict[str, Any]]) -> str:
    """Prepared rows as the JSON array INSERT_JOBS reads: the text json.dumps gives the same objects.

    A row's args and meta are JSON text already (`prepare` encoded them to look for characters PostgreSQL
    cannot store), which json.dumps cannot take as a value: it would have to parse them back and encode them
    again. So each row is written around its values' JSON, every value's text being json.dumps's own
    (strings and datetimes through it, ints as str(int), floats as repr(float), as it writes them).
    bench/batch_rows.py measures it against json.dumps of the objects; tests/test_enqueue.py proves it gives
    json.dumps's bytes for awkward values."""
    dumps = json.dumps
    return (
        "["
        + ", ".join(
            f'{{"kind": {_quoted(r["kind"])}, "queue": {_quoted(r["queue"])}, "args": {r["args"]}, '
            f'"meta": {r["meta"]}, "priority": {int(r["priority"])}, '
            f'"run_at": {"null" if r["run_at"] is None else dumps(r["run_at"].isoformat())}, '
            f'"delay": {float(r["delay"])!r}, "max_attempts": {_json_int(r["max_attempts"])}}}'
            for r in rows
        )
        + "]"
    )


def _json_int(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def _prepare_one(kind: str, args: Any, options: dict[str, Any]) -> dict[str, Any]:
    """`prepare` for one job; with tracing off, without asking for a trace context to carry."""
    return prepare(JobRequest(kind, args, **options), trace=None if tracing.active() else NO_TRACE)


def _key_changed_hands(row: dict[str, Any]) -> EnqueueConflict:
    return EnqueueConflict("conflict", f"idempotency key {row['key']!r} kept changing hands; try again")


def _prepare_in_batch(index: int, request: JobRequest, trace: Mapping[str, str]) -> dict[str, Any]:
    """`prepare`, with the job's position in the batch in the error (message and details)."""
    try:
        return prepare(request, trace=trace)
    except EnqueueError as exc:
        raise EnqueueError(exc.code, f"jobs[{index}]: {exc}", {"index": index, "errors": exc.details}) from None


def _prepare_batch(jobs: Sequence[JobRequest | Mapping[str, Any]]) -> list[dict[str, Any]]:
    trace = tracing.carrier()  # once for the batch: every job carries the same context
    return [_prepare_in_batch(index, request, trace) for index, request in enumerate(_requests(jobs))]


@dataclass
class _BatchPlan:
    """How a prepared batch is written: up to PLAIN_BATCH_MAX rows without keys in one statement; otherwise
    window-keyed rows one by one, then ids reserved for the rest, plain rows by COPY and live-keyed rows by
    one insert that skips keys a live job holds, all in one transaction."""

    rows: list[dict[str, Any]]
    windowed: list[int] = field(init=False)
    plain: list[int] = field(init=False)
    keyed: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.windowed = [i for i, row in enumerate(self.rows) if row["ttl"] is not None]
        self.plain = [i for i, row in enumerate(self.rows) if row["ttl"] is None and row["key"] is None]
        self.keyed = [i for i, row in enumerate(self.rows) if row["ttl"] is None and row["key"] is not None]

    @property
    def one_statement(self) -> bool:
        return len(self.plain) == len(self.rows) <= PLAIN_BATCH_MAX

    @property
    def reserved(self) -> int:
        return len(self.plain) + len(self.keyed)

    def keyed_params(self, ids: list[int], db_now: datetime) -> dict[str, list[Any]]:
        return _keyed_params(ids[len(self.plain) :], [self.rows[i] for i in self.keyed], db_now)

    def keys(self) -> list[str]:
        return [self.rows[i]["key"] for i in self.keyed]

    def keyed_results(
        self,
        ids: list[int],
        params: dict[str, list[Any]],
        inserted: set[int],
        holders: dict[str, int],
        results: dict[int, Enqueued],
    ) -> None:
        for job_id, run_at, i in zip(ids[len(self.plain) :], params["run_ats"], self.keyed, strict=True):
            if job_id in inserted:
                results[i] = Enqueued(job_id, False, run_at)
            else:
                results[i] = Enqueued(holders[self.rows[i]["key"]], True, None)


def _inserted_in_one_statement(inserted: list[tuple[Any, ...]]) -> list[Enqueued]:
    """INSERT_JOBS's rows (id, run_at) as results in the batch's order: ids are given in that order."""
    return [Enqueued(job_id, False, run_at) for job_id, run_at in sorted(inserted)]


def _in_order(results: dict[int, Enqueued], count: int) -> list[Enqueued]:
    return [results[i] for i in range(count)]


# --- one job: each twin is its I/O ------------------------------------------------------------------


def enqueue(conn: Connectable, kind: str, args: Any = None, **options: Any) -> Enqueued:
    """Enqueue one job; `options` are the fields of JobRequest. One statement, one round trip."""
    conn = sync_connection(conn)
    if not tracing.active():  # asked once: no span to open, no trace context to carry
        return _insert_one(conn, _prepare_one(kind, args, options))
    with tracing.enqueue_span(**{"dygo.job.kind": kind}) as span:
        row = _prepare_one(kind, args, options)
        result = _insert_one(conn, row)
        tracing.set_attributes(span, job_queue=row["queue"], job_id=result.id)
        return result


async def aenqueue(conn: Connectable, kind: str, args: Any = None, **options: Any) -> Enqueued:
    """`enqueue` for an AsyncConnection."""
    conn = await async_connection(conn)
    if not tracing.active():
        return await _ainsert_one(conn, _prepare_one(kind, args, options))
    with tracing.enqueue_span(**{"dygo.job.kind": kind}) as span:
        row = _prepare_one(kind, args, options)
        result = await _ainsert_one(conn, row)
        tracing.set_attributes(span, job_queue=row["queue"], job_id=result.id)
        return result


def _insert_one(conn: psycopg.Connection, row: dict[str, Any]) -> Enqueued:
    insert, lookup = _single_statement(row)
    for _ in range(3):  # the job holding the key may finish between insert and lookup
        found = conn.execute(insert, row).fetchone()
        if found is not None:
            return Enqueued(found[0], False, found[1])
        assert lookup is not None
        existing = conn.execute(lookup, (row["key"],)).fetchone()
        if existing is not None:
            return Enqueued(existing[0], True, existing[1])
    raise _key_changed_hands(row)


async def _ainsert_one(conn: psycopg.AsyncConnection, row: dict[str, Any]) -> Enqueued:
    insert, lookup = _single_statement(row)
    for _ in range(3):
        found = await (await conn.execute(insert, row)).fetchone()
        if found is not None:
            return Enqueued(found[0], False, found[1])
        assert lookup is not None
        existing = await (await conn.execute(lookup, (row["key"],))).fetchone()
        if existing is not None:
            return Enqueued(existing[0], True, existing[1])
    raise _key_changed_hands(row)


# --- a batch: each twin is its I/O ------------------------------------------------------------------


def enqueue_many(conn: Connectable, jobs: Sequence[JobRequest | Mapping[str, Any]]) -> list[Enqueued]:
    """Enqueue a batch all-or-nothing; results are in the order of `jobs`. Up to PLAIN_BATCH_MAX jobs
    without idempotency keys are one statement (INSERT_JOBS); others take a transaction with COPY.

    One `dygo.enqueue` span for the whole batch (it is one transaction, and a span per job would
    cost more than the COPY of that job): every job's handler span is a child of it.
    """
    with tracing.enqueue_span(**{"dygo.jobs.count": len(jobs)}):
        return _enqueue_batch(sync_connection(conn), _BatchPlan(_prepare_batch(jobs)))


async def aenqueue_many(conn: Connectable, jobs: Sequence[JobRequest | Mapping[str, Any]]) -> list[Enqueued]:
    """`enqueue_many` for an AsyncConnection."""
    with tracing.enqueue_span(**{"dygo.jobs.count": len(jobs)}):
        return await _aenqueue_batch(await async_connection(conn), _BatchPlan(_prepare_batch(jobs)))


def _enqueue_batch(conn: psycopg.Connection, plan: _BatchPlan) -> list[Enqueued]:
    rows = plan.rows
    if not rows:
        return []
    if plan.one_statement:
        return _inserted_in_one_statement(conn.execute(sql.INSERT_JOBS, (rows_json(rows),)).fetchall())
    results: dict[int, Enqueued] = {}
    with joined_transaction(conn):
        for i in plan.windowed:
            results[i] = _insert_one(conn, rows[i])
        db_now, ids = one(conn.execute(sql.RESERVE_JOB_IDS, (plan.reserved,)).fetchone())
        if plan.plain:
            with conn.cursor().copy(sql.COPY_JOBS) as copy:
                for job_id, i in zip(ids, plan.plain, strict=False):
                    values = copy_row(job_id, rows[i], db_now)
                    copy.write_row(values)
                    results[i] = Enqueued(job_id, False, values[6])
        if plan.keyed:
            params = plan.keyed_params(ids, db_now)
            inserted = {r[0] for r in conn.execute(sql.INSERT_JOBS_UNLESS_LIVE_KEY, params).fetchall()}
            holders: dict[str, int] = dict(conn.execute(sql.LIVE_JOBS_BY_KEYS, (plan.keys(),)).fetchall())
            plan.keyed_results(ids, params, inserted, holders, results)
    return _in_order(results, len(rows))


async def _aenqueue_batch(conn: psycopg.AsyncConnection, plan: _BatchPlan) -> list[Enqueued]:
    rows = plan.rows
    if not rows:
        return []
    if plan.one_statement:
        cursor = await conn.execute(sql.INSERT_JOBS, (rows_json(rows),))
        return _inserted_in_one_statement(await cursor.fetchall())
    results: dict[int, Enqueued] = {}
    async with await ajoined_transaction(conn):
        for i in plan.windowed:
            results[i] = await _ainsert_one(conn, rows[i])
        db_now, ids = one(await (await conn.execute(sql.RESERVE_JOB_IDS, (plan.reserved,))).fetchone())
        if plan.plain:
            async with conn.cursor().copy(sql.COPY_JOBS) as copy:
                for job_id, i in zip(ids, plan.plain, strict=False):
                    values = copy_row(job_id, rows[i], db_now)
                    await copy.write_row(values)
                    results[i] = Enqueued(job_id, False, values[6])
        if plan.keyed:
            params = plan.keyed_params(ids, db_now)
            inserted = {r[0] for r in await (await conn.execute(sql.INSERT_JOBS_UNLESS_LIVE_KEY, params)).fetchall()}
            cursor = await conn.execute(sql.LIVE_JOBS_BY_KEYS, (plan.keys(),))
            holders: dict[str, int] = dict(await cursor.fetchall())
            plan.keyed_results(ids, params, inserted, holders, results)
    return _in_order(results, len(rows))
