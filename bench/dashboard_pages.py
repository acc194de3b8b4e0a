"""How fast each dashboard page renders with 1,000,000 jobs in the table.

Seeds a database (`bench_dashboard`) on the embedded server with a realistic mix, in a few
INSERT ... SELECT generate_series statements: mostly succeeded jobs over 30 days, and thousands of
pending, scheduled, retrying, active, paused, cancelled and dead jobs over several queues and kinds,
the dead ones with an attempt history and ~20 error shapes; plus 30 days of daily stats, the last
hour of minute stats and a few schedules. Workflows: 100,000 finished ones of three nodes whose jobs
retention has deleted, and one running workflow whose group node holds --group jobs (100,000 of the
million; enqueued by store.workflows, its jobs settled through the job triggers that count them).
Then VACUUM ANALYZE (what autovacuum does on a live table), a real `dygo serve`, a login through the
form, and every page timed over --requests requests (after --warmup unmeasured ones), one at a time,
from this client: p50 / p95 / max in ms.
--cold skips the VACUUM: the state right after a burst of writes, before autovacuum has been by.

    .venv/bin/python bench/dashboard_pages.py              # seed (about 1-2 minutes) and measure
    .venv/bin/python bench/dashboard_pages.py --reuse      # measure again on the seeded database
    .venv/bin/python bench/dashboard_pages.py --cold       # seed without VACUUM: the worst case
    .venv/bin/python bench/dashboard_pages.py --jobs 100000 --group 10000 --requests 10   # a quick look

Seeding SQL lives here, not in store/: it fabricates history the way a long-running system would
have written it, and nothing in dygo runs it.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from dygo.store.workflows import Workflow, enqueue_workflow
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "bench_dashboard"
TOKEN = "bench-admin-token-0123456789abcdef"
BUDGET_MS = 200.0
BIG_WORKFLOW = "nightly-import"  # the running workflow with the big group node
FINISHED_WORKFLOWS = 100_000

QUEUES = ["default", "slow", "emails", "reports", "billing"]
KINDS = [
    "email.send",
    "email.digest",
    "report.render",
    "report.export",
    "billing.charge",
    "billing.refund",
    "image.resize",
    "search.index",
    "webhook.deliver",
    "user.sync",
    "cache.warm",
    "audit.archive",
]
# Error shapes of dead jobs: numbers, hex and uuids vary per job, so each is one dead-letter group.
ERRORS = [
    "TimeoutError: gave up after ' || (n % 90) || ' seconds",
    "KeyError: user_' || n || '",
    "ConnectionError: could not reach 10.0.' || (n % 255) || '.' || (n % 7) || ':5432",
    "ValueError: invoice ' || md5(n::text)::uuid || ' has no lines",
    "RuntimeError: worker memory at 0x' || to_hex(n * 7919) || ' exhausted",
    "HTTPError: 503 Service Unavailable for https://hooks.example.com/' || (n % 1000) || '",
    "PermissionError: bucket reports-' || (n % 12) || ' denied",
    "lease expired: worker web-' || (n % 9) || ':' || (1000 + n % 50) || ':ab12cd stopped renewing it",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the database -----------------------------------------------------------------------------------------


def server_url() -> str:
    dygo = Path(sys.executable).with_name("dygo")
    return subprocess.run([str(dygo), "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def database_url(server: str, name: str) -> str:
    if "://" in server:
        return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    return make_conninfo(server, dbname=name)


def seeded_jobs(url: str) -> int:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0]
    except psycopg.Error:
        return 0


def seed(server: str, url: str, jobs: int, vacuum: bool, dead_every: int = 100, group: int = 0) -> None:
    """`jobs` in all: the big workflow's (its group and three single-job nodes) and the rest."""
    workflow_jobs = group + 3 if group else 0
    big_workflow = jobs
    jobs -= workflow_jobs
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run(
        [str(Path(sys.executable).with_name("dygo")), "migrate"],
        check=True,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("ALTER TABLE dygo_jobs DISABLE TRIGGER USER")  # no notifies, no 1M-row "enqueued today"
        error = (
            "CASE (n / 100 + n / 1300) % "
            + str(len(ERRORS))
            + "".join(f" WHEN {i} THEN '{shape}'" for i, shape in enumerate(ERRORS))
            + " END"
        )
        # Spread over n / 100 too, so every 100th job (the dead ones) still varies in queue, kind and error.
        queues = "(ARRAY['" + "','".join(QUEUES) + "'])[1 + (n * 7 + n / 1000) % " + str(len(QUEUES)) + "]"
        kinds = "(ARRAY['" + "','".join(KINDS) + "'])[1 + (n * 13 + n / 100) % " + str(len(KINDS)) + "]"
        # n is the id; ids grow with time over 30 days. The newest 1% holds most of the live work.
        conn.execute(f"""
            INSERT INTO dygo_jobs (id, kind, queue, args, state, priority, run_at, attempt, max_attempts,
                                   enqueued_at, started_at, finished_at, result, last_error, errors,
                                   lease_owner, lease_token, lease_deadline, dead_fingerprint)
            SELECT n, kind, queue, args, state, 0, run_at, attempt, 20, enqueued_at,
                   CASE WHEN state <> 'pending' OR attempt > 0 THEN enqueued_at + interval '1 second' END,
                   CASE WHEN state IN ('succeeded', 'dead', 'cancelled') THEN enqueued_at + interval '3 seconds' END,
                   CASE WHEN state = 'succeeded' THEN jsonb_build_object('ok', true, 'took_ms', n % 900) END,
                   CASE WHEN state = 'dead' OR attempt > 0 THEN error END,
                   CASE WHEN state = 'dead' OR attempt > 0 THEN (
                       SELECT jsonb_agg(jsonb_build_object(
                           'attempt', a, 'at', enqueued_at + make_interval(mins => a), 'worker', 'web-1:4242:ab12cd',
                           'error', error, 'traceback', 'Traceback (most recent call last):' || E'\\n' ||
                           '  File "/app/jobs/handlers.py", line ' || (40 + a) || ', in run' || E'\\n' ||
                           '    return client.call(payload)' || E'\\n' || error))
                       FROM generate_series(1, CASE WHEN state = 'dead' THEN 3 ELSE attempt END) AS a)
                   ELSE '[]' END,
                   CASE WHEN state = 'active' THEN 'web-1:4242:ab12cd' END,
                   CASE WHEN state = 'active' THEN gen_random_uuid() END,
                   CASE WHEN state = 'active' THEN now() + interval '5 minutes' END,
                   CASE WHEN state = 'dead' THEN dygo_error_fingerprint(error) END
            FROM (
                SELECT n, {kinds} AS kind, {queues} AS queue,
                       jsonb_build_object('user_id', n % 50000, 'email', 'user' || (n % 50000) || '@example.com',
                                          'order', 'ord-' || n) AS args,
                       {error} AS error,
                       now() - make_interval(secs => ({jobs} - n) * 2592000.0 / {jobs}) AS enqueued_at,
                       CASE
                           WHEN n % {dead_every} = 7 THEN 'dead'
                           WHEN n % 1000 = 13 THEN 'cancelled'
                           WHEN n % 5000 = 17 THEN 'paused'
                           WHEN n % 1000 = 21 THEN 'pending'  -- retrying: an old job waiting for its backoff
                           WHEN n > {jobs} * 0.99 AND n % 500 = 3 THEN 'active'
                           WHEN n > {jobs} * 0.99 AND n % 4 IN (0, 1) THEN 'pending'
                           ELSE 'succeeded'
                       END AS state,
                       CASE
                           WHEN n % 1000 = 21 THEN now() + make_interval(secs => n % 3600)
                           WHEN n > {jobs} * 0.99 AND n % 4 = 1 THEN now() + make_interval(secs => n % 86400)
                           ELSE now() - make_interval(secs => ({jobs} - n) * 2592000.0 / {jobs})
                       END AS run_at,
                       CASE WHEN n % 1000 = 21 THEN (1 + n % 5)::int ELSE 0 END AS attempt
                FROM generate_series(1::bigint, {jobs}) AS n
            ) AS j""")
        conn.execute(f"SELECT setval('dygo_jobs_id_seq', {jobs})")
        conn.execute("ALTER TABLE dygo_jobs ENABLE TRIGGER USER")
        log(f"seed: {jobs:,} jobs in {time.monotonic() - started:.0f}s")
        if group:
            started = time.monotonic()
            seed_workflows(conn, url, group)
            log(
                f"seed: {FINISHED_WORKFLOWS:,} finished workflows and one of {big_workflow - jobs:,} jobs "
                f"in {time.monotonic() - started:.0f}s"
            )
        # The rollups a month of this traffic would have left: per day, per minute for the last hours.
        conn.execute(f"""
            INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded, failed, dead, reaped)
            SELECT (now() AT TIME ZONE 'UTC')::date - d, q, k, c, c * 97 / 100, c / 20, c / 100, c / 1000
            FROM generate_series(0, 29) AS d, unnest(ARRAY['{"','".join(QUEUES)}']) AS q,
                 unnest(ARRAY['{"','".join(KINDS)}']) AS k,
                 LATERAL (SELECT ({jobs} / 30 / {len(QUEUES) * len(KINDS)}) * (80 + (d * 37) % 40) / 100 AS c) AS x""")
        conn.execute(f"""
            INSERT INTO dygo_minute_stats (minute, queue, kind, enqueued, succeeded, failed, dead, reaped)
            SELECT date_trunc('minute', now()) - make_interval(mins => m), q, k, c, c, c / 15, c / 60, 0
            FROM generate_series(0, 119) AS m, unnest(ARRAY['{"','".join(QUEUES)}']) AS q,
                 unnest(ARRAY['{"','".join(KINDS)}']) AS k,
                 LATERAL (SELECT 1 + (m * 7 + length(k)) % 5 AS c) AS x""")
        conn.execute("""
            INSERT INTO dygo_schedules (name, spec, kind, queue, next_run_at, last_run_at, last_job_id)
            SELECT 'schedule-' || s, '*/' || (5 + s) || ' * * * *', 'report.render', 'reports',
                   now() + make_interval(mins => s), now() - make_interval(mins => s), s * 997
            FROM generate_series(1, 12) AS s""")
        started = time.monotonic()
        conn.execute("ANALYZE")
        if vacuum:
            conn.execute("VACUUM")
            # Right after a big insert a pass may leave the visibility map unset (another snapshot still
            # open somewhere on the server); autovacuum would come back, so does this.
            while conn.execute(
                "SELECT relallvisible < relpages * 0.9 FROM pg_class WHERE oid = 'dygo_jobs'::regclass"
            ).fetchone()[0]:
                time.sleep(1)
                conn.execute("VACUUM dygo_jobs")
        log(f"seed: {'VACUUM ' if vacuum else ''}ANALYZE in {time.monotonic() - started:.0f}s")


def seed_workflows(conn: psycopg.Connection, url: str, group: int) -> None:
    """Finished workflows (fetch -> transform -> load) whose jobs retention has deleted, one in 20 failed
    and one in 100 cancelled; then the big one, enqueued and moved as workers would move it: fetch and
    audit succeeded, its group of `group` jobs 99% succeeded, 0.3% dead, the rest pending, report waiting."""
    conn.execute(f"""
        WITH w AS (
            INSERT INTO dygo_workflows (name, state, nodes, nodes_left, nodes_failed, created_at, finished_at)
            SELECT (ARRAY['import', 'export', 'billing-run', 'thumbnails'])[1 + n % 4] || '-' || n,
                   CASE WHEN n % 100 = 3 THEN 'cancelled' WHEN n % 20 = 1 THEN 'failed' ELSE 'succeeded' END,
                   3, 0, CASE WHEN n % 100 = 3 OR n % 20 = 1 THEN 2 ELSE 0 END,
                   now() - make_interval(secs => ({FINISHED_WORKFLOWS} - n) * 25.0),
                   now() - make_interval(secs => ({FINISHED_WORKFLOWS} - n) * 25.0 - 60)
            FROM generate_series(1, {FINISHED_WORKFLOWS}) AS n
            RETURNING id, state, finished_at
        ), nodes AS (
            INSERT INTO dygo_nodes (workflow_id, name, is_group, state, jobs, jobs_left, succeeded, dead,
                                    cancelled, deps, deps_left, cancels, finished_at)
            SELECT w.id, x.name, false, x.state, 1, 0, (x.state = 'succeeded')::int, (x.state = 'failed')::int,
                   (x.state = 'cancelled')::int, (x.step > 1)::int, 0,
                   (x.state = 'cancelled' AND (w.state = 'failed' OR x.step = 3))::int, w.finished_at
            FROM w, LATERAL (VALUES
                (1, 'fetch', 'succeeded'),
                (2, 'transform', CASE w.state WHEN 'failed' THEN 'failed' WHEN 'cancelled' THEN 'cancelled'
                                 ELSE 'succeeded' END),
                (3, 'load', CASE WHEN w.state = 'succeeded' THEN 'succeeded' ELSE 'cancelled' END)
            ) AS x(step, name, state)
            RETURNING id, workflow_id, name, state
        )
        INSERT INTO dygo_edges (workflow_id, upstream, downstream, policy, state)
        SELECT u.workflow_id, u.id, d.id, 'cancel', CASE WHEN u.state = 'succeeded' THEN 'met' ELSE 'cancel' END
        FROM nodes u JOIN nodes d ON d.workflow_id = u.workflow_id
         AND (u.name, d.name) IN (('fetch', 'transform'), ('transform', 'load'))""")
    workflow = Workflow(BIG_WORKFLOW)
    workflow.add("fetch", "import.fetch", {"source": "s3://imports/nightly"}, queue="default")
    workflow.map("process", "import.row", [{"row": i} for i in range(group)], after="fetch", queue="default")
    workflow.add("audit", "import.audit", {}, after="fetch", queue="default")
    workflow.add("report", "import.report", {}, after=["process", "audit"], queue="default")
    handle = enqueue_workflow(conn, workflow)
    settled = "state = %s, started_at = now(), finished_at = now()"
    members = "node_id = %s AND id - (SELECT min(id) FROM dygo_jobs WHERE node_id = %s) BETWEEN %s AND %s"
    process = handle.nodes["process"]
    # Each statement in a session of its own: PL/pgSQL plans a trigger's statement at its first call in a
    # session, and dygo_jobs_moved's join of the transition tables planned for one row is a nested loop,
    # quadratic in the rows of a later, bigger statement.
    for statement, params in (
        (
            f"UPDATE dygo_jobs SET {settled} WHERE id = ANY(%s)",
            ("succeeded", [handle.jobs["fetch"], handle.jobs["audit"]]),
        ),
        (
            f"UPDATE dygo_jobs SET {settled}, result = '{{\"ok\": true}}' WHERE {members}",
            ("succeeded", process, process, 0, group * 99 // 100 - 1),
        ),
        (
            f"UPDATE dygo_jobs SET {settled}, last_error = 'ValueError: bad row' WHERE {members}",
            ("dead", process, process, group * 99 // 100, group * 993 // 1000 - 1),
        ),
    ):
        with psycopg.connect(url, autocommit=True) as session:
            session.execute(statement, params)


# --- serve and the pages ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(url: str, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_")}
    env.update(DATABASE_URL=url, DYGO_ADMIN_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("dygo")), "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def logged_in(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("dygo serve did not answer /healthz within 30 s")
        time.sleep(0.2)
    form = client.get("/dashboard/login").text
    csrf = html.unescape(re.search(r'name="csrf" value="([^"]+)"', form).group(1))
    reply = client.post("/dashboard/login", data={"csrf": csrf, "token": TOKEN, "next": "/dashboard/"})
    if reply.status_code != 303:
        raise SystemExit(f"login failed: {reply.status_code} {reply.text[:300]}")
    return client


def cursor_of_page(client: httpx.Client, path: str, page: int) -> str:
    """The URL of page `page` of a list (jobs, workflows), by following its next links."""
    base = path.split("?")[0]
    for _ in range(page - 1):
        found = re.search(r'href="([^"]+)" rel="next"|rel="next" href="([^"]+)"', client.get(path).text)
        if not found:
            raise SystemExit(f"{path} has fewer than {page} pages")
        link = html.unescape(found.group(1) or found.group(2))
        path = link if link.startswith("/") else base + link
    return path


def pages(client: httpx.Client, url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        dead_id = conn.execute("SELECT max(id) FROM dygo_jobs WHERE state = 'dead'").fetchone()[0]
        old_id = conn.execute("SELECT min(id) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()[0]
        big = conn.execute("SELECT id FROM dygo_workflows WHERE name = %s", (BIG_WORKFLOW,)).fetchone()
        member = conn.execute(
            "SELECT max(j.id) FROM dygo_jobs j JOIN dygo_nodes n ON n.id = j.node_id WHERE n.workflow_id = %s",
            (big[0] if big else None,),
        ).fetchone()[0]
    workflows = {}
    if big:
        workflows = {
            "workflows": "/dashboard/workflows",
            "workflows state=running": "/dashboard/workflows?state=running",
            "workflows state=failed": "/dashboard/workflows?state=failed",
            "workflows page 50 (cursor)": cursor_of_page(client, "/dashboard/workflows", 50),
            "workflow graph (big group)": f"/dashboard/workflows/{big[0]}",
            "job detail (workflow job)": f"/dashboard/jobs/{member}",
        }
    return {
        "overview": "/dashboard/",
        "overview fragment": "/dashboard/live",
        "overview minutes fragment": "/dashboard/live/minutes",
        "jobs": "/dashboard/jobs",
        "jobs state=dead": "/dashboard/jobs?state=dead",
        "jobs state=pending": "/dashboard/jobs?state=pending",
        "jobs state=scheduled": "/dashboard/jobs?state=scheduled",
        "jobs state=succeeded": "/dashboard/jobs?state=succeeded",
        "jobs kind=billing.refund": "/dashboard/jobs?kind=billing.refund",
        "jobs queue+kind+dead": "/dashboard/jobs?queue=emails&kind=email.send&state=dead",
        "jobs text (common)": "/dashboard/jobs?q=example.com",
        "jobs text (rare)": "/dashboard/jobs?q=ord-123456%22",
        "jobs text+state=dead": "/dashboard/jobs?state=dead&q=TimeoutError",
        "jobs page 50 (cursor)": cursor_of_page(client, "/dashboard/jobs", 50),
        "jobs kind page 50 (cursor)": cursor_of_page(client, "/dashboard/jobs?kind=email.send", 50),
        "job detail (dead)": f"/dashboard/jobs/{dead_id}",
        "job detail (oldest)": f"/dashboard/jobs/{old_id}",
        "dead letters": "/dashboard/dead",
        "queues": "/dashboard/queues",
        "schedules": "/dashboard/schedules",
        "bulk retry confirm (dead)": "/dashboard/bulk/retry/confirm?state=dead",
        "vacuum dead confirm": "/dashboard/queues/default/vacuum-dead?older_than=7d",
        **workflows,
    }


def measure(client: httpx.Client, path: str, requests: int, warmup: int) -> list[float]:
    timings = []
    for i in range(warmup + requests):
        started = time.perf_counter()
        reply = client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        if reply.status_code != 200:
            raise SystemExit(f"GET {path}: {reply.status_code} {reply.text[:300]}")
        if i >= warmup:
            timings.append(elapsed)
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20, help="measured requests per page")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured requests per page first")
    parser.add_argument("--reuse", action="store_true", help="keep the seeded database if it has --jobs rows")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="seed with ANALYZE only: no VACUUM, no visibility map (index-only scans visit the heap)",
    )
    parser.add_argument("--dead-every", type=int, default=100, help="one job in this many is dead (default 1%%)")
    parser.add_argument(
        "--group", type=int, default=100_000, help="jobs of the big workflow's group node, of --jobs (0: no workflows)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()

    server = server_url()
    url = database_url(server, DATABASE)
    if args.reuse and seeded_jobs(url) >= args.jobs:
        log(f"reusing {DATABASE} ({seeded_jobs(url):,} jobs)")
    else:
        seed(server, url, args.jobs, vacuum=not args.cold, dead_every=args.dead_every, group=args.group)
    port = free_port()
    serve = start_serve(url, port)
    try:
        client = logged_in(f"http://127.0.0.1:{port}")
        rows = []
        for name, path in pages(client, url).items():
            timings = sorted(measure(client, path, args.requests, args.warmup))
            p95 = timings[max(0, round(0.95 * len(timings)) - 1)]
            rows.append((name, statistics.median(timings), p95, timings[-1]))
            log(f"{name:30} p50 {rows[-1][1]:7.1f} ms  p95 {p95:7.1f} ms")
    finally:
        serve.terminate()
        serve.wait(10)
    jobs = seeded_jobs(url)
    if args.markdown:
        print(f"| page ({jobs:,} jobs, {args.requests} requests each) | p50 ms | p95 ms | max ms |")
        print("|---|--:|--:|--:|")
        for name, p50, p95, worst in rows:
            print(f"| {name} | {p50:.1f} | {p95:.1f} | {worst:.1f} |")
    else:
        print(f"{'page':30} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}   ({jobs:,} jobs, {args.requests} requests each)")
        for name, p50, p95, worst in rows:
            flag = "" if p95 < BUDGET_MS else f"  over {BUDGET_MS:.0f} ms"
            print(f"{name:30} {p50:8.1f} {p95:8.1f} {worst:8.1f}{flag}")
    over = [name for name, _, p95, _ in rows if p95 >= BUDGET_MS]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
