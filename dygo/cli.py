"""The `dygo` command: parses flags and hands over to store, worker or app."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from pathlib import Path

import psycopg

from dygo.logs import configure_logging
from store.config import ENVIRONMENTS, Settings, load_settings
from store.durations import parse_duration
from store.errors import ConfigError, DatabaseUnavailable, SchemaError

EXIT_USAGE = 2


def duration(text: str) -> float:
    try:
        return parse_duration(text, field="value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer greater than 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dygo", description="Durable background jobs on PostgreSQL.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--env", choices=ENVIRONMENTS, help="environment (default: $DYGO_ENV or development)")
        return sub

    command("migrate", "apply pending database migrations")

    serve = command("serve", "run the admin service (HTTP API)")
    serve.add_argument("--host", help="bind address (default: $DYGO_HOST, else 0.0.0.0 when $PORT is set "
                       "as on Heroku, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: $PORT or 8000)")

    worker = command("worker", "run a worker process")
    worker.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                        help="process only this queue (repeatable; default: every configured queue)")
    worker.add_argument("--concurrency", type=positive_int, metavar="N",
                        help="jobs run at once per queue in this process (overrides queues.yml)")
    worker.add_argument("--poll-interval", type=duration, default=60.0, metavar="DURATION",
                        help="fallback poll when no notification arrives (default: 60s)")
    worker.add_argument("--poll-only", action="store_true", help="do not LISTEN; rely on polling and timers")
    worker.add_argument("--once", action="store_true",
                        help="fire due schedules, recover expired leases, claim one batch, run it, settle, exit")
    worker.add_argument("--shutdown-timeout", type=duration, default=30.0, metavar="DURATION",
                        help="on SIGTERM, how long in-flight jobs may finish before they are handed back "
                        "(default: 30s)")

    command("schedules", "list the cron schedules: spec, time zone, next and last fire, status")
    command("status", "show each queue's jobs by state, its lag and pause, and the live workers")

    db = commands.add_parser("db", help="the embedded PostgreSQL server (used when DATABASE_URL is unset)")
    db.add_argument("action", choices=["url", "status", "start", "stop"])
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = build_parser().parse_args(argv)
    try:
        if args.command == "db":
            return db_command(args.action)
        settings = load_settings(env=args.env)
        if args.command == "migrate":
            return migrate_command(settings)
        if args.command == "serve":
            return serve_command(settings, args)
        if args.command == "schedules":
            return schedules_command(settings)
        if args.command == "status":
            return status_command(settings)
        return worker_command(settings, args)
    except ConfigError as exc:
        print(f"dygo: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (SchemaError, DatabaseUnavailable) as exc:
        print(f"dygo: {exc}", file=sys.stderr)
        return 1
    except psycopg.OperationalError as exc:
        # Not a traceback: libpq's first lines say what failed (host, port, user), never the password.
        print(f"dygo: cannot reach the database: {_database_message(exc)}", file=sys.stderr)
        return 1


def _database_message(exc: Exception) -> str:
    from store.db import scrub

    return scrub(" ".join(str(exc).split()), os.environ.get("DATABASE_URL", ""))


def migrate_command(settings: Settings) -> int:
    import psycopg

    from store.db import database_url
    from store.migrate import migrate

    with psycopg.connect(database_url(settings)) as conn:
        applied = migrate(conn)
    if applied:
        for migration in applied:
            print(f"applied {migration.version:04d}_{migration.name}")
    else:
        print("schema is up to date")
    return 0


def _check_schema(url: str) -> None:
    import psycopg

    from store.migrate import check_schema

    with psycopg.connect(url) as conn:
        check_schema(conn)


def serve_command(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.auth import check_protection
    from app.main import create_app
    from store.db import database_url
    from store.registry import load_jobs

    jobs = load_jobs(settings)
    host = args.host or os.environ.get("DYGO_HOST") or ("0.0.0.0" if os.environ.get("PORT") else "127.0.0.1")
    port = args.port or int(os.environ.get("PORT", "8000"))
    # Before any database work: an unprotected API outside development on localhost is refused.
    check_protection(settings, host)
    url = database_url(settings)
    _check_schema(url)
    print(f"dygo serve: http://{host}:{port} (API docs at /docs)", flush=True)
    print(f"dygo serve: auth {_auth_summary(settings)}", flush=True)
    # log_config=None: uvicorn's lines (access log included) go through dygo's stderr logging, so
    # stdout keeps lifecycle lines only, as for the worker.
    uvicorn.run(create_app(settings, jobs, url), host=host, port=port, log_level="info", log_config=None)
    return 0


def _auth_summary(settings: Settings) -> str:
    """How the API is protected, without ever showing a token."""
    if not settings.api_tokens:
        return "off (development on localhost, no token configured)"
    roles = [role for role, _ in settings.api_tokens]
    return f"bearer tokens: {roles.count('admin')} admin, {roles.count('read')} read-only"


def worker_command(settings: Settings, args: argparse.Namespace) -> int:
    from store.db import database_url
    from store.registry import load_jobs
    from worker.runtime import Worker, WorkerOptions

    jobs = load_jobs(settings)
    names = args.queues or settings.queue_names
    unknown = [name for name in names if name not in settings.queues]
    if unknown:
        raise ConfigError("--queue", unknown[0], f"is not configured in {settings.config_dir / 'queues.yml'}; "
                          f"configured queues: {', '.join(settings.queue_names)}")
    queues = {name: args.concurrency or settings.queues[name].concurrency for name in dict.fromkeys(names)}
    options = WorkerOptions(queues=queues, poll_interval=args.poll_interval, poll_only=args.poll_only,
                            once=args.once, shutdown_timeout=args.shutdown_timeout)
    jobs.freeze()
    url = database_url(settings)
    return asyncio.run(Worker(settings, jobs, options, url).run())


def schedules_command(settings: Settings) -> int:
    """The schedules as the workers last synced them, as a plain table; times in each schedule's zone."""
    import psycopg

    from store.db import database_url
    from store.migrate import check_schema
    from store.schedules import list_schedules

    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        rows = list_schedules(conn)
    if not rows:
        print("no schedules (declare them in code or config/schedules.yml; a worker syncs them when it starts)")
        return 0
    table = [("NAME", "SPEC", "TIMEZONE", "NEXT", "LAST", "STATUS", "LAST JOB", "WHEN")]
    for row in rows:
        last_job = f"{row['last_job']['id']} {row['last_job']['state'] or 'gone'}" if row["last_job"] else "-"
        table.append((row["name"], row["spec"], row["timezone"], _local_time(row["next_run_at"], row["timezone"]),
                      _local_time(row["last_run_at"], row["timezone"]), row["status"], last_job, row["description"]))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[-1])
    return 0


def status_command(settings: Settings) -> int:
    """Queues x states, lag and pause, then the live workers: the numbers GET /metrics reports."""
    import psycopg

    from app.system import WORKER_SEEN_WITHIN
    from store.admin import COUNTED_STATES
    from store.db import database_url
    from store.metrics import snapshot
    from store.migrate import check_schema

    configured = {name: queue.concurrency for name, queue in settings.queues.items()}
    with psycopg.connect(database_url(settings), autocommit=True) as conn:
        check_schema(conn)
        snap = snapshot(conn, configured, WORKER_SEEN_WITHIN)
    table = [("QUEUE", *(state.upper() for state in COUNTED_STATES), "LAG", "PAUSED")]
    for queue in snap.queues:
        table.append((queue["name"], *(str(queue["counts"][state]) for state in COUNTED_STATES),
                      f"{snap.lag.get(queue['name'], 0.0):.1f}s", "yes" if queue["paused"] else "no"))
    _print_table(table)
    print()
    if not snap.workers:
        print(f"workers: none seen in the last {WORKER_SEEN_WITHIN:g}s")
        return 0
    print(f"workers: {len(snap.workers)} live")
    workers = [("WORKER", "QUEUES", "LAST SEEN")]
    for worker in snap.workers:
        queues = ", ".join(f"{name}={slots}" for name, slots in sorted((worker["queues"] or {}).items()))
        workers.append((worker["id"], queues, worker["last_seen_at"].strftime("%Y-%m-%d %H:%M:%S %Z")))
    _print_table(workers)
    return 0


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _local_time(moment: datetime | None, timezone: str) -> str:
    if moment is None:
        return "-"
    from zoneinfo import ZoneInfo

    return moment.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def db_command(action: str) -> int:
    from store import embedded

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
