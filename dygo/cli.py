"""The `dygo` command: parses flags and hands over to store, worker or app."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psycopg

from dygo.logs import (
    BLOCK_ESCAPES,
    LIFECYCLE_LOGGER,
    LOG_FORMATS,
    configure_logging,
    escape_controls,
    flush_then_exit,
    resolve_log_format,
)
from dygo.store.admin import STATES
from dygo.store.config import (
    ENVIRONMENTS,
    POOL_SIZE_ENV,
    Duration,
    PoolSize,
    PositiveCount,
    PositiveDuration,
    Settings,
    checked_text,
    load_settings,
    resolve_env,
)
from dygo.store.durations import parse_duration
from dygo.store.errors import AdminError, ConfigError, DatabaseUnavailable, SchemaError, StatementError
from dygo.store.outage import describe, is_outage
from dygo.store.workflows import WORKFLOW_STATES

EXIT_USAGE = 2


def flag_type(annotation: Any, name: str) -> Callable[[str], Any]:
    """argparse's `type` for a flag whose value follows one of the settings' rules (store/config.py): the same
    check and the same words as in config/dygo.yml, with the text given."""

    def check(text: str) -> Any:
        try:
            return checked_text(annotation, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    check.__name__ = name
    return check


duration = flag_type(Duration, "duration")
# Not 0: a zero poll interval makes the worker poll in a busy loop.
positive_duration = flag_type(PositiveDuration, "positive_duration")
positive_int = flag_type(PositiveCount, "positive_int")
pool_size = flag_type(PoolSize, "pool_size")


WEB_CONCURRENCY_ENV = "WEB_CONCURRENCY"


def web_concurrency() -> int:
    """$WEB_CONCURRENCY: how many web processes `dygo serve` runs (the platform convention; default 1)."""
    raw = os.environ.get(WEB_CONCURRENCY_ENV, "").strip()
    if not raw:
        return 1
    try:
        processes: int = checked_text(PositiveCount, raw)
    except ValueError as exc:
        raise ConfigError(WEB_CONCURRENCY_ENV, "environment", str(exc)) from None
    return processes


def port_number(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dygo", description="Durable background jobs on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--env", choices=ENVIRONMENTS, help="environment (default: $DYGO_ENV or development)")
        return sub

    def logged(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--log-format",
            choices=LOG_FORMATS,
            help="stderr log lines (and stdout lifecycle lines) as text or one JSON object per line "
            "(default: $DYGO_LOG_FORMAT, else json with --env production, else text)",
        )
        return sub

    migrate = command("migrate", "apply pending database migrations")
    migrate.add_argument(
        "--to",
        type=int,
        metavar="VERSION",
        help="bring the schema to this migration: apply the missing ones up to it, or undo the newer ones "
        "with their down steps (default: apply all)",
    )

    serve = logged(command("serve", "run the admin service (HTTP API)"))
    serve.add_argument(
        "--host", help="bind address (default: $DYGO_HOST, else 0.0.0.0 when $PORT is set as on Heroku, else 127.0.0.1)"
    )
    serve.add_argument("--port", type=int, help="port (default: $PORT or 8000)")
    serve.add_argument(
        "--pool-size",
        type=pool_size,
        metavar="N",
        help="database connections per web process for requests, at least 2 (default: "
        "$DYGO_SERVE_POOL_SIZE, else serve_pool_size in dygo.yml, else 10); each process holds "
        "one more for ?wait=. Web processes: $WEB_CONCURRENCY (default 1)",
    )

    worker = logged(command("worker", "run a worker process"))
    worker.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="NAME",
        help="process only this queue (repeatable; default: every configured queue)",
    )
    worker.add_argument(
        "--concurrency",
        type=positive_int,
        metavar="N",
        help="jobs run at once per queue in this process (overrides queues.yml)",
    )
    worker.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="jobs run at once in this process, all queues together (default: max_concurrency "
        "in dygo.yml, else no cap)",
    )
    worker.add_argument(
        "--poll-interval",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="fallback poll when no notification arrives (default: 60s)",
    )
    worker.add_argument("--poll-only", action="store_true", help="do not LISTEN; rely on polling and timers")
    worker.add_argument(
        "--once",
        action="store_true",
        help="fire due schedules, recover expired leases, claim one batch per queue, run it, settle, exit",
    )
    worker.add_argument(
        "--shutdown-timeout",
        type=duration,
        default=30.0,
        metavar="DURATION",
        help="on SIGTERM, how long in-flight jobs may finish before they are handed back (default: 30s)",
    )
    worker.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="N",
        help="serve this process's own Prometheus metrics on http://HOST:N/metrics (default: off; 0 picks a free port)",
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address for --metrics-port (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    worker.add_argument(
        "--no-cron",
        dest="cron",
        action="store_false",
        default=None,
        help="do not fire cron schedules in this worker (default: fire them, unless dygo.yml says cron: false)",
    )
    worker.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="create PATH once the worker is ready (its services running and, unless polling "
        "only, listening); removed when it stops",
    )

    command("schedules", "list the cron schedules: spec, time zone, next and last fire, status")

    jobs = command("jobs", "list, show, retry or cancel jobs (what the dashboard does, for a terminal)")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="a table of jobs, newest first", description="a table of jobs")
    listing.add_argument("--queue", help="only this queue")
    listing.add_argument("--kind", help="only this kind")
    listing.add_argument("--state", choices=STATES, help="only jobs in this state")
    listing.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N jobs (default: 50)")
    listing.add_argument("--oldest", action="store_true", help="oldest first")
    listing.add_argument(
        "--parent", type=positive_int, metavar="ID", help="only the child jobs of this parent (ctx.call, ctx.map)"
    )
    show = actions.add_parser(
        "show", help="one job: args, meta, result, progress, attempt errors", description="one job in full"
    )
    show.add_argument("id", type=positive_int)
    steps = actions.add_parser(
        "steps",
        help="a job's recorded durable steps in call order (key, op, attempt, when, duration, result)",
        description="a job's recorded steps",
    )
    steps.add_argument("id", type=positive_int)
    retry_from = actions.add_parser(
        "retry-from",
        help="retry from a step: forget it and every later step; retry the job if dead or cancelled",
        description="forget a recorded step and every step after it",
    )
    retry_from.add_argument("id", type=positive_int)
    retry_from.add_argument("key", help="the step's key, name#occurrence (e.g. 'charge#1')")
    for action, what in (
        ("retry", "dead or cancelled jobs back to pending now, with a fresh attempt budget"),
        ("cancel", "cancel pending, scheduled, paused or waiting jobs"),
    ):
        sub = actions.add_parser(action, help=what, description=what)
        sub.add_argument("ids", type=positive_int, nargs="+", metavar="ID")
    workflows = command("workflows", "list workflows (and batches) or show one with its nodes")
    workflow_actions = workflows.add_subparsers(dest="workflows_command", required=True, metavar="ACTION")
    listing = workflow_actions.add_parser(
        "list", help="a table of workflows, newest first", description="a table of workflows, newest first"
    )
    listing.add_argument("--state", choices=WORKFLOW_STATES, help="only workflows in this state")
    listing.add_argument(
        "--limit", type=positive_int, default=50, metavar="N", help="at most N workflows (default: 50)"
    )
    show = workflow_actions.add_parser(
        "show",
        help="one workflow: its counters, then each node with its state, job counts and why it waits",
        description="one workflow and its nodes",
    )
    show.add_argument("id", type=positive_int)
    events = command("events", "emit an event: wake the jobs waiting for its key (ctx.wait_for_event)")
    event_actions = events.add_subparsers(dest="events_command", required=True, metavar="ACTION")
    emit = event_actions.add_parser(
        "emit",
        help="emit the event KEY (the first emit of a key wins; a later one changes nothing)",
        description="emit an event: the jobs waiting for its key resume with its payload",
    )
    emit.add_argument("key", metavar="KEY", help="the event's key (e.g. 'order:42')")
    emit.add_argument("--payload", type=json_value, metavar="JSON", help="the event's payload, as JSON (default: null)")
    command("status", "show each queue's jobs by state, its lag and pause, the live workers and the failing kinds")

    db = commands.add_parser("db", help="the embedded PostgreSQL server (used when DATABASE_URL is unset)")
    db.add_argument("action", choices=["url", "status", "start", "stop"])

    init = commands.add_parser(
        "init",
        help="write a new project: config/, jobs/ with an example and its test, "
        "Procfile, .gitignore (never overwrites a file)",
        description="write a new project (never overwrites a file)",
    )
    init.add_argument("directory", nargs="?", default=".", metavar="DIR", help="where (default: here)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configure_logging(_log_format(args))
        if args.command == "db":
            return db_command(args.action)
        if args.command == "init":
            from dygo.scaffold import init_project

            return init_project(args.directory)
        if args.command == "migrate":  # migrating runs no job: it needs no config/queues.yml
            return migrate_command(load_settings(env=args.env, queues=False), args.to)
        settings = load_settings(env=args.env)
        if args.command == "serve":
            return serve_command(settings, args)
        if args.command == "worker":
            return worker_command(settings, args)
        with terminal_safe_output():
            if args.command == "schedules":
                return schedules_command(settings)
            if args.command == "status":
                return status_command(settings)
            if args.command == "jobs":
                return jobs_command(settings, args)
            if args.command == "workflows":
                return workflows_command(settings, args)
            if args.command == "events":
                return events_command(settings, args)
        raise AssertionError(f"no handler for the command {args.command!r}")
    except ConfigError as exc:
        print(f"dygo: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (SchemaError, DatabaseUnavailable) as exc:
        print(f"dygo: {exc}", file=sys.stderr)
        return 1
    except StatementError as exc:
        # One line, not a traceback: what the command was doing and the database's error (store/outage.py).
        print(f"dygo {args.command}: {_without_password(str(exc))}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        # Not a traceback: libpq's first lines say what failed (host, port, user), never the password.
        if is_outage(exc):
            print(f"dygo: cannot reach the database: {_database_message(exc)}", file=sys.stderr)
        else:
            print(
                f"dygo {args.command}: a database statement failed: {_without_password(describe(exc))}", file=sys.stderr
            )
        return 1


class TerminalSafe(io.TextIOBase):
    """A text stream that writes every control character but the newline as an escape (\\x1b, \\r, \\u2028)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text.translate(BLOCK_ESCAPES))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def terminal_safe_output() -> Any:
    """The commands that print what the database holds (kinds, error messages, tracebacks: often end users'
    data) print it through TerminalSafe, so no escape sequence or carriage return reaches the operator's
    terminal. A field printed on one line is escaped whole (escape_controls), newlines too."""
    with contextlib.redirect_stdout(TerminalSafe(sys.stdout)), contextlib.redirect_stderr(TerminalSafe(sys.stderr)):
        yield


def _database_message(exc: Exception) -> str:
    return _without_password(" ".join(str(exc).split()))


def _without_password(text: str) -> str:
    from dygo.store.db import scrub

    return scrub(text, os.environ.get("DATABASE_URL", ""))


def _log_format(args: argparse.Namespace) -> str:
    if not hasattr(args, "log_format"):
        return "text"
    try:
        return resolve_log_format(args.log_format, resolve_env(args.env))
    except ValueError as exc:
        raise ConfigError("DYGO_LOG_FORMAT", os.environ.get("DYGO_LOG_FORMAT", ""), str(exc)) from None


def migrate_command(settings: Settings, to: int | None = None) -> int:
    from dygo.store.db import database_url, direct_url
    from dygo.store.migrate import migrate, revert

    # DDL and the migration lock want a session of their own: the direct URL when DATABASE_URL is a pooler.
    with psycopg.connect(direct_url() or database_url(settings)) as conn:
        reverted = revert(conn, to) if to is not None else []
        applied = migrate(conn, to)
    for migration in reverted:
        print(f"reverted {migration}")
    for migration in applied:
        print(f"applied {migration}")
    if not reverted and not applied:
        print("schema is up to date")
    return 0


DEFAULT_SCHEMA_WAIT = 60.0


def _schema_wait() -> float:
    """DYGO_SCHEMA_WAIT: how long serve and worker wait at start for a missing or older schema (default 60s)."""
    raw = os.environ.get("DYGO_SCHEMA_WAIT", "").strip()
    if not raw:
        return DEFAULT_SCHEMA_WAIT
    try:
        return parse_duration(raw, field="DYGO_SCHEMA_WAIT")
    except ValueError as exc:
        raise ConfigError("DYGO_SCHEMA_WAIT", raw, f"{exc} (e.g. 60s, 5m, or 0 not to wait)") from None


def _wait_for_schema(url: str, command: str) -> None:
    """Like the database, the schema may not be there yet when a process manager starts everything at once
    (the release phase's `dygo migrate` still running): wait for it up to DYGO_SCHEMA_WAIT, saying so once."""
    from dygo.store.migrate import wait_for_schema

    timeout = _schema_wait()

    def waiting(reason: SchemaError) -> None:
        logging.getLogger(f"dygo.{command}").warning("%s; waiting up to %gs for it (DYGO_SCHEMA_WAIT)", reason, timeout)

    wait_for_schema(url, timeout, waiting)


def serve_command(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from dygo.app import connections
    from dygo.app.auth import check_protection
    from dygo.app.guard import HostRule
    from dygo.app.main import create_app
    from dygo.store.db import database_url
    from dygo.store.limits import check_kinds
    from dygo.store.loading import load_jobs

    if args.pool_size:
        settings = settings.model_copy(update={"serve_pool_size": args.pool_size})
    processes = web_concurrency()
    jobs = load_jobs(settings)
    check_kinds(settings.limits, jobs, str(settings.config_dir / "queues.yml"))
    host = args.host or os.environ.get("DYGO_HOST") or ("0.0.0.0" if os.environ.get("PORT") else "127.0.0.1")
    port = args.port or int(os.environ.get("PORT", "8000"))
    # Before any database work: an unprotected API outside development on localhost is refused.
    check_protection(settings, host)
    url = database_url(settings)
    signal.signal(signal.SIGTERM, flush_then_exit)  # uvicorn re-raises it after its graceful stop: exit 0
    try:
        _wait_for_schema(url, "serve")
    except psycopg.Error as exc:
        if is_outage(exc):
            raise
        raise StatementError("start-up: checking the schema", exc) from exc
    lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
    lifecycle.info(
        "dygo serve: http://%s:%s (API docs at /docs)",
        host,
        port,
        extra={"fields": {"event": "listening", "host": host, "port": port}},
    )
    hosts = HostRule(host, settings.allowed_hosts)
    lifecycle.info("dygo serve: answers Host %s", hosts.describe(), extra={"fields": {"event": "hosts"}})
    lifecycle.info("dygo serve: auth %s", _auth_summary(settings), extra={"fields": {"event": "auth"}})
    lifecycle.info(
        "dygo serve: %d web process%s, up to %d database connections each for requests (+1 for ?wait=)",
        processes,
        "" if processes == 1 else "es",
        settings.serve_pool_size,
        extra={"fields": {"event": "capacity", "web_processes": processes, "pool_size": settings.serve_pool_size}},
    )
    cap, backlog = connections.configure(settings)
    lifecycle.info(
        "dygo serve: up to %d connections each; request headers within %gs, bodies within %gs",
        cap,
        settings.serve_header_timeout,
        settings.serve_body_timeout,
        extra={
            "fields": {
                "event": "slow_clients",
                "max_connections": cap,
                "header_timeout": settings.serve_header_timeout,
                "body_timeout": settings.serve_body_timeout,
            }
        },
    )
    # log_config=None: uvicorn's lines (access log included) go through dygo's stderr logging, so
    # stdout keeps lifecycle lines only, as for the worker.
    if processes == 1:
        uvicorn.run(
            create_app(settings, jobs, url, host),
            host=host,
            port=port,
            log_level="info",
            log_config=None,
            http=connections.PROTOCOL,
            backlog=backlog,
        )
        return 0
    # Several processes: uvicorn's supervisor starts each with a fresh interpreter that builds its app
    # from the environment (web_process_app), so what this process resolved is handed over there.
    os.environ.update(
        {
            "DATABASE_URL": url,
            "DYGO_ENV": settings.env,
            POOL_SIZE_ENV: str(settings.serve_pool_size),
            "DYGO_LOG_FORMAT": _log_format(args),
            "DYGO_HOST": host,
        }
    )
    uvicorn.run(
        f"{__name__}:web_process_app",
        factory=True,
        workers=processes,
        host=host,
        port=port,
        log_level="info",
        log_config=None,
        http=connections.PROTOCOL,
        backlog=backlog,
    )
    return 0


def web_process_app() -> Any:
    """The app of one of several web processes (WEB_CONCURRENCY > 1), from what serve_command put in the
    environment."""
    from dygo.app import connections
    from dygo.app.main import create_app
    from dygo.store.db import database_url
    from dygo.store.loading import load_jobs

    _die_with_supervisor()
    settings = load_settings()
    configure_logging(resolve_log_format(None, settings.env))
    connections.configure(settings)
    return create_app(settings, load_jobs(settings), database_url(settings), os.environ["DYGO_HOST"])


def _die_with_supervisor() -> None:
    """Linux: this web process gets SIGTERM (a graceful stop) when the supervising `dygo serve` dies, even
    by SIGKILL, so no orphan keeps serving the port. Elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the supervisor died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _auth_summary(settings: Settings) -> str:
    """How the API is protected, without ever showing a token."""
    if not settings.api_tokens:
        return "off (development on localhost, no token configured)"
    roles = [role for role, _ in settings.api_tokens]
    return f"bearer tokens: {roles.count('admin')} admin, {roles.count('read')} read-only"


def worker_command(settings: Settings, args: argparse.Namespace) -> int:
    from dygo.store.db import database_url
    from dygo.store.limits import check_kinds
    from dygo.store.loading import load_jobs
    from dygo.worker.options import WorkerOptions
    from dygo.worker.runtime import Worker

    jobs = load_jobs(settings)
    check_kinds(settings.limits, jobs, str(settings.config_dir / "queues.yml"))
    names = args.queues or settings.queue_names
    unknown = [name for name in names if name not in settings.queues]
    if unknown:
        raise ConfigError(
            "--queue",
            unknown[0],
            f"is not configured in {settings.config_dir / 'queues.yml'}; "
            f"configured queues: {', '.join(settings.queue_names)}",
        )
    queues = {name: args.concurrency or settings.queues[name].concurrency for name in dict.fromkeys(names)}
    options = WorkerOptions(
        queues=queues,
        poll_interval=args.poll_interval,
        poll_only=args.poll_only,
        once=args.once,
        shutdown_timeout=args.shutdown_timeout,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        cron=settings.cron if args.cron is None else args.cron,
        ready_file=args.ready_file,
        max_concurrency=args.max_concurrency or settings.max_concurrency,
    )
    jobs.freeze()
    url = database_url(settings)
    previous = signal.signal(signal.SIGTERM, flush_then_exit)  # a stop while waiting for the schema: exit 0
    try:
        _wait_for_schema(url, "worker")
    except psycopg.Error as exc:
        if not is_outage(exc):
            raise StatementError("start-up: checking the schema", exc) from exc
        # The database is away: the worker waits for it (and checks the schema once it is back).
    finally:
        signal.signal(signal.SIGTERM, previous)
    return asyncio.run(Worker(settings, jobs, options, url).run())


def schedules_command(settings: Settings) -> int:
    """The schedules as the workers last synced them, as a plain table; times in each schedule's zone."""
    from dygo.store.db import database_url
    from dygo.store.migrate import check_schema
    from dygo.store.schedules import list_schedules

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        rows = list_schedules(conn)
    if not rows:
        print("no schedules (declare them in code or config/schedules.yml; a worker syncs them when it starts)")
        return 0
    table = [("NAME", "SPEC", "TIMEZONE", "NEXT", "LAST", "STATUS", "LAST JOB", "WHEN")]
    for row in rows:
        last_job = f"{row['last_job']['id']} {row['last_job']['state'] or 'gone'}" if row["last_job"] else "-"
        table.append(
            (
                row["name"],
                row["spec"],
                row["timezone"],
                _local_time(row["next_run_at"], row["timezone"]),
                _local_time(row["last_run_at"], row["timezone"]),
                row["status"],
                last_job,
                row["description"],
            )
        )
    _print_table(table)
    return 0


def status_command(settings: Settings) -> int:
    """Queues x states, lag and pause, the live workers, then the failing kinds (today and yesterday)."""
    from dygo.app.system import WORKER_SEEN_WITHIN
    from dygo.store.admin import COUNTED_STATES, failing_kinds
    from dygo.store.db import database_url
    from dygo.store.metrics import snapshot
    from dygo.store.migrate import check_schema

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        snap = snapshot(conn, settings.concurrency, WORKER_SEEN_WITHIN)
        failing = failing_kinds(conn)
    # The queue's own pause is STATUS (as in `dygo schedules`): PAUSED is already the paused jobs' count.
    table = [("QUEUE", *(state.upper() for state in COUNTED_STATES), "LAG", "STATUS")]
    for queue in snap.queues:
        table.append(
            (
                queue["name"],
                *(str(queue["counts"][state]) for state in COUNTED_STATES),
                f"{snap.lag.get(queue['name'], 0.0):.1f}s",
                "paused" if queue["paused"] else "active",
            )
        )
    _print_table(table)
    print()
    if snap.workers:
        print(f"workers: {len(snap.workers)} live")
        workers = [("WORKER", "QUEUES", "LAST SEEN")]
        for worker in snap.workers:
            queues = ", ".join(f"{name}={slots}" for name, slots in sorted((worker["queues"] or {}).items()))
            workers.append((worker["id"], queues, worker["last_seen_at"].strftime("%Y-%m-%d %H:%M:%S %Z")))
        _print_table(workers)
    else:
        print(f"workers: none seen in the last {WORKER_SEEN_WITHIN:g}s")
    print()
    if failing:
        print("failing kinds (today and yesterday, UTC):")
        _print_table(
            [
                ("KIND", "DEAD", "FAILED ATTEMPTS"),
                *((row["kind"], str(row["dead"]), str(row["failed"])) for row in failing),
            ]
        )
    else:
        print("failing kinds: none today or yesterday")
    if snap.limits:
        print()
        print("limits (cluster-wide):")
        _print_table(
            [
                ("SCOPE", "NAME", "KEY", "CONCURRENCY", "IN USE", "RATE", "STARTED", "WAITING"),
                *(
                    (
                        u.scope,
                        u.name,
                        f"meta.{u.key}" if u.key else "-",
                        str(u.concurrency_limit) if u.concurrency_limit is not None else "-",
                        str(sum(u.in_use.values())),
                        u.rate_limit or "-",
                        str(sum(u.started.values())),
                        str(u.waiting),
                    )
                    for u in snap.limits
                ),
            ]
        )
    return 0


def jobs_command(settings: Settings, args: argparse.Namespace) -> int:
    """`dygo jobs ...`: the same store functions as the API. Exit 1 when a job is missing or its
    state does not allow the action (the reason on stderr), after acting on every other id."""
    from dygo.store.db import database_url
    from dygo.store.migrate import check_schema

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        if args.jobs_command == "list":
            return _list_jobs(conn, args)
        if args.jobs_command == "show":
            return _show_job(conn, args.id)
        if args.jobs_command == "steps":
            return _show_steps(conn, args.id)
        if args.jobs_command == "retry-from":
            return _retry_from_step(conn, args.id, args.key)
        return _act_on_jobs(conn, args.jobs_command, args.ids)


def _list_jobs(conn: psycopg.Connection, args: argparse.Namespace) -> int:
    from dygo.store import admin

    where = admin.JobFilter(queue=args.queue, kind=args.kind, state=args.state, parent_id=args.parent)
    order: Literal["newest", "oldest"] = "oldest" if args.oldest else "newest"
    jobs: list[dict[str, Any]] = []
    position = None
    while len(jobs) < args.limit:  # a filter that scans can return short pages before the end
        page = admin.list_jobs(conn, where, order=order, limit=args.limit - len(jobs), position=position)
        jobs += page.jobs
        if page.next_position is None:
            break
        position = page.next_position
    if not jobs:
        print("no jobs match")
        return 0
    table = [("ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "RUN AT", "FINISHED", "LAST ERROR")]
    for job in jobs:
        # A job that failed and then succeeded keeps its last error in the history (`dygo jobs show`);
        # in the list it would read as if the job had failed.
        shown = job["last_error"] if job["state"] != "succeeded" else None
        error = shown.splitlines()[0][:60] if shown else ""
        table.append(
            (
                str(job["id"]),
                job["kind"],
                job["queue"],
                job["state"],
                f"{job['attempt']}/{job['max_attempts'] or '-'}",
                _utc(job["run_at"]),
                _utc(job["finished_at"]),
                error,
            )
        )
    _print_table(table)
    return 0


def _show_steps(conn: psycopg.Connection, job_id: int) -> int:
    import json

    from dygo.store import steps
    from dygo.store.durations import format_duration
    from dygo.store.errors import NotFound

    try:
        recorded = steps.job_steps(conn, job_id)
    except NotFound as exc:
        print(f"dygo: {exc}", file=sys.stderr)
        return 1
    if not recorded:
        print(f"job {job_id} recorded no step")
        return 0
    table = [("SEQ", "KEY", "OP", "ATTEMPT", "RECORDED", "DURATION", "RESULT")]
    for step in recorded:
        if step["op"] == "sleep":
            shown = f"wakes {_utc(step['wake_at'])}"
        elif step["op"] == "event" and step["state"] != "done":  # a wait for an event: its key and state
            deadline = f" until {_utc(step['wake_at'])}" if step["wake_at"] else ""
            shown = f"{step['state']} for event {step['waits_for']!r}{deadline}"
        else:
            text = json.dumps(step["result"])
            shown = text if len(text) <= 60 else text[:59] + "…"
        table.append(
            (
                str(step["seq"]),
                step["key"],
                step["op"],
                str(step["attempt"]),
                _utc(step["recorded_at"]),
                format_duration(step["duration"]),
                shown,
            )
        )
    _print_table(table)
    return 0


def _retry_from_step(conn: psycopg.Connection, job_id: int, key: str) -> int:
    from dygo.store import steps
    from dygo.store.errors import Conflict, NotFound

    try:
        forgotten = steps.forget_steps(conn, job_id, key)
    except (NotFound, Conflict) as exc:
        print(f"dygo: {exc}", file=sys.stderr)
        return 1
    print(f"job {job_id}: forgot {', '.join(forgotten.keys)}; it is now {forgotten.job['state']}")
    return 0


def _show_job(conn: psycopg.Connection, job_id: int) -> int:
    import json

    from dygo.store import job_reads

    job = job_reads.get_job(conn, job_id)
    if job is None:
        print(f"dygo: no job with id {job_id}", file=sys.stderr)
        return 1
    fields = [
        ("id", job["id"]),
        ("kind", job["kind"]),
        ("queue", job["queue"]),
        ("state", job["state"]),
        ("priority", job["priority"]),
        ("attempt", f"{job['attempt']}/{job['max_attempts'] or '-'}"),
        ("run at", _utc(job["run_at"])),
        ("enqueued at", _utc(job["enqueued_at"])),
        ("started at", _utc(job["started_at"])),
        ("finished at", _utc(job["finished_at"])),
        ("lease owner", job["lease_owner"] or "-"),
        ("reaped", job["reap_count"]),
        ("idempotency key", job["idempotency_key"] or "-"),
    ]
    if job.get("node_id") is not None:
        fields.append(
            ("workflow", f"{job['workflow_id']}, node {job['node']} (dygo workflows show {job['workflow_id']})")
        )
    fields += [
        ("args", json.dumps(job["args"])),
        ("meta", json.dumps(job["meta"])),
        ("result", "-" if job["result"] is None else json.dumps(job["result"])),
    ]
    progress = job.get("progress")
    if progress:
        message = f" {progress['message']}" if progress.get("message") else ""
        fields.append(("progress", f"{progress['fraction'] * 100:.0f}%{message} (attempt {progress['attempt']})"))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name.ljust(width)}  {escape_controls(str(value))}")
    for error in job["errors"]:
        at = _utc(datetime.fromisoformat(error["at"])) if error.get("at") else "?"
        line = f"attempt {error['attempt']} failed at {at} on {error.get('worker') or '?'}: {error['error']}"
        print(f"\n{escape_controls(line)}")
        if error.get("traceback"):
            print(error["traceback"].rstrip())
    return 0


def _act_on_jobs(conn: psycopg.Connection, action: str, ids: list[int]) -> int:
    from dygo.store import admin

    code = 0
    for job_id in dict.fromkeys(ids):
        try:
            job = admin.act_on_job(conn, action, job_id)
        except AdminError as exc:
            print(f"dygo: {exc}", file=sys.stderr)
            code = 1
            continue
        print(f"job {job_id}: {'retried' if action == 'retry' else 'cancelled'}, now {job['state']}")
    return code


def json_value(text: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be JSON (a quoted string is '\"text\"'), got {text!r}: {exc}") from None


def events_command(settings: Settings, args: argparse.Namespace) -> int:
    """`dygo events emit KEY`: store.events.emit, as POST /api/v1/events/{key} does. Exit 1 for a bad key or
    payload; a duplicate (the key was emitted before) is said, and exits 0."""
    from dygo.store import events
    from dygo.store.db import database_url
    from dygo.store.errors import EventError
    from dygo.store.migrate import check_schema

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        try:
            emitted = events.emit(conn, args.key, args.payload)
        except EventError as exc:
            print(f"dygo: {exc}", file=sys.stderr)
            return 1
    if emitted.duplicate:
        print(f"event {args.key!r} was emitted before: the first emit wins, so nothing changed and nobody woke")
    else:
        print(f"emitted event {args.key!r}: {emitted.woken} waiting job(s) woken")
    return 0


def workflows_command(settings: Settings, args: argparse.Namespace) -> int:
    """`dygo workflows list|show`: the store functions GET /api/v1/workflows reads. Exit 1 for an unknown id."""
    from dygo.store.db import database_url
    from dygo.store.migrate import check_schema

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        if args.workflows_command == "list":
            return _list_workflows(conn, args.state, args.limit)
        return _show_workflow(conn, args.id)


def _list_workflows(conn: psycopg.Connection, state: str | None, limit: int) -> int:
    from dygo.store import workflows

    rows = workflows.list_workflows(conn, state=state, limit=limit)
    if not rows:
        print("no workflows match")
        return 0
    table = [("ID", "NAME", "STATE", "NODES", "LEFT", "FAILED", "CREATED", "FINISHED")]
    for row in rows:
        table.append(
            (
                str(row["id"]),
                row["name"],
                row["state"],
                str(row["nodes"]),
                str(row["nodes_left"]),
                str(row["nodes_failed"]),
                _utc(row["created_at"]),
                _utc(row["finished_at"]),
            )
        )
    _print_table(table)
    return 0


def _show_workflow(conn: psycopg.Connection, workflow_id: int) -> int:
    import json

    from dygo.store import workflows

    try:
        shown = workflows.get_workflow(conn, workflow_id)
    except AdminError as exc:
        print(f"dygo: {exc}", file=sys.stderr)
        return 1
    nodes = shown["nodes"]
    fields = [
        ("id", shown["id"]),
        ("name", shown["name"]),
        ("state", shown["state"]),
        ("nodes", f"{len(nodes)} ({shown['nodes_left']} not ended, {shown['nodes_failed']} failed or cancelled)"),
        ("fail fast", "yes" if shown["fail_fast"] else "no"),
        ("created at", _utc(shown["created_at"])),
        ("finished at", _utc(shown["finished_at"])),
        ("idempotency key", shown["idempotency_key"] or "-"),
    ]
    if shown["result"] is not None:
        fields.append(("result", json.dumps(shown["result"])))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name.ljust(width)}  {escape_controls(str(value))}")
    after: dict[str, list[str]] = {}
    for edge in shown["edges"]:
        policy = "" if edge["policy"] == "cancel" else f" ({edge['policy']})"
        after.setdefault(edge["downstream"], []).append(edge["upstream"] + policy)
    print()
    table = [("NODE", "STATE", "JOB", "JOBS", "SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED", "LEFT", "AFTER", "WAIT")]
    for node in nodes:
        table.append(
            (
                node["name"],
                node["state"] if node["sealed"] else f"{node['state']} (open)",
                "group" if node["is_group"] else str(node["job_id"] or "-"),
                str(node["jobs"]),
                str(node["succeeded"]),
                str(node["dead"]),
                str(node["cancelled"]),
                str(node["skipped"]),
                str(node["jobs_left"]),
                ", ".join(after.get(node["name"], [])) or "-",
                node["wait"] or "-",
            )
        )
    _print_table(table)
    return 0


def _utc(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    rows = [tuple(escape_controls(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _local_time(moment: datetime | None, timezone: str) -> str:
    if moment is None:
        return "-"
    from zoneinfo import ZoneInfo

    return moment.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def db_command(action: str) -> int:
    from dygo.store import embedded

    data_dir = Path(os.environ.get("DYGO_DATA_DIR", ".dygo"))
    if os.environ.get("DATABASE_URL"):
        print("DATABASE_URL is set: dygo uses that database, not the embedded one", file=sys.stderr)
    if action in ("url", "start"):
        print(embedded.ensure_running(data_dir))
        return 0
    if action == "stop":
        print("stopped" if embedded.stop(data_dir) else "not running")
        return 0
    state = embedded.status(data_dir)
    print(f"data:    {state.pgdata}{'' if state.initialised else ' (not initialised)'}")
    print(f"running: {'yes, pid ' + str(state.pid) if state.running else 'no'}")
    if state.url:
        print(f"url:     {state.url}")
    return 0 if state.running else 3
