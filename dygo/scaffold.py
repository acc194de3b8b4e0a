"""`dygo init [DIR]`: the files of a new dygo project.

All or nothing: when any of the files already exists, nothing is written and the command names
every file in the way (exit 1), so running it twice, or in a project that has its own Procfile,
never overwrites anyone's work.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from pathlib import Path

# The seed's "Generated projects include" block, exactly.
QUEUES_YML = """\
queues:
  - name: default
    concurrency: 4
"""

DYGO_YML = """\
# dygo settings (optional keys; unknown keys are rejected). Durations: "30s", "5m", "24h", "30d".
# Every key is described in the dygo manual: Reference > Configuration.

# Modules `dygo worker` and `dygo serve` import for job definitions (from this folder).
jobs: [jobs]

# lease_ttl: 30s              # a running job's lease; renewed every half of it
# max_reaps: 3                # lease expiries a job survives before it is dead as poison
# default_timeout: 5m         # handler deadline for kinds without `timeout` (0 = none)
# default_max_attempts: 20    # attempts for kinds without `max_attempts`
# claim_batch_size: 100       # most jobs one claim statement takes
# claim_ahead: 5ms            # claim beyond free slots what they run in this time, for short jobs (0 = off)
# default_concurrency: 4     # most jobs of one kind a worker runs at once, for kinds without `concurrency`
# max_concurrency: 16         # most jobs a worker runs at once, all queues together (--max-concurrency)
# max_batch_size: 1000        # most jobs in one POST /api/v1/jobs/batch
# max_payload_bytes: 1MiB     # largest request body the API accepts
# max_result_bytes: 64KiB     # largest handler result stored
# max_step_result_bytes: 1MiB # largest ctx.step result stored (larger fails the step)
# strict_steps: false         # a replay calling its steps out of the recorded order fails (not warns)
# completed_retention: 24h    # succeeded jobs are deleted this long after they finished (0 = keep)
# dead_retention: 30d         # dead jobs (0 = keep)
# cancelled_retention: 30d    # cancelled jobs (0 = keep)
# workflow_retention: 30d     # finished workflows, their nodes and edges (0 = keep)
# event_retention: 7d         # emitted events (dygo.emit) and waits' placeholders (0 = keep)
# stats_retention: 90d        # daily stats rows (0 = keep)
# retention_interval: 60s     # how often one worker of the cluster trims
# cron: true                  # this worker fires cron schedules (false: leave them to other workers)
# serve_pool_size: 10         # database connections per `dygo serve` process for requests
#
# allowed_hosts: [jobs.example.com]   # Host names `dygo serve` answers besides its bound address
# failed_token_limit: 5       # wrong tokens from one client address before a lock-out (429)
# failed_token_window: 5m     # ... within this window
# failed_token_global_limit: 100  # wrong tokens from all addresses together within the window
# serve_header_timeout: 10s   # a request's headers must arrive within this (slow clients are closed)
# serve_body_timeout: 30s     # ... and its body within this of its headers
# serve_max_connections: 1000 # connections per `dygo serve` process (lowered to fit the fd limit)
#
# API tokens: prefer the DYGO_ADMIN_TOKEN / DYGO_READ_TOKEN environment variables, or keep this
# file out of version control. `dygo serve` needs a token anywhere but development on localhost.
# api_tokens:
#   admin: [a-long-random-admin-token]
#   read: [a-long-random-read-token]
"""

SCHEDULES_YML = """\
# Cron schedules: each fires one job per occurrence, however many workers run.
# Every worker syncs this list into the database when it starts (a removed entry is disabled).
# Keys: name, cron, kind (required); args, timezone (IANA, default UTC), queue, priority,
# max_attempts, missed (once | skip).
schedules:
#  - name: nightly-greeting
#    cron: "30 2 * * *"          # 5-field cron, or @hourly, @daily, @weekly, @monthly, @yearly
#    timezone: Europe/Paris
#    kind: hello.greet
#    args: {name: night shift}
"""

JOBS_INIT = '''\
"""This project's job handlers.

`dygo worker` and `dygo serve` import this package (`jobs: [jobs]` in config/dygo.yml): import every
module that defines jobs here, so both processes know every kind.
"""

from jobs import hello  # noqa: F401
'''

JOBS_HELLO = '''\
"""An example job: enqueue it with `enqueue(conn, "hello.greet", {"name": "Ada"})`."""

from pydantic import BaseModel

from dygo import JobContext, job


class Greet(BaseModel):
    name: str


@job("hello.greet", queue="default", timeout="30s", max_attempts=5)
async def greet(ctx: JobContext, args: Greet) -> dict:
    """Returns a greeting: the worker stores it as the job's result. Raising an exception is a failed
    attempt, retried with backoff; `Abort("why")` makes the job dead at once."""
    return {"greeting": f"Hello, {args.name}!"}
'''

JOBS_TEST = '''\
"""Handlers are plain functions: call them with a context from `make_context`, no worker, no database."""

import asyncio

from dygo import make_context
from jobs.hello import Greet, greet


def test_greet_returns_a_greeting() -> None:
    ctx = make_context("hello.greet")
    assert asyncio.run(greet(ctx, Greet(name="Ada"))) == {"greeting": "Hello, Ada!"}
'''

PROCFILE = """\
release: dygo migrate
web: exec dygo serve
worker: exec dygo worker
"""

GITIGNORE = """\
# the embedded PostgreSQL's data (dygo db ...) and local state
.dygo/
.venv/
__pycache__/
*.py[cod]
.pytest_cache/
.env
"""

# The name dygo is installed by (`pip install dygo-jobs`); it imports as `dygo`. The index's `dygo` is
# another project.
DISTRIBUTION = "dygo-jobs"


def requirements() -> str:
    """requirements.txt: dygo at the version that generated the project (what the platform installs)."""
    try:
        pin = "==" + metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        pin = ""
    return f"{DISTRIBUTION}{pin}\n"


def python_version() -> str:
    """.python-version: the minor version this project was generated with (the platform picks its patch)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}\n"


def app_json(name: str) -> str:
    """app.json: the platform manifest (Heroku's format): the Procfile's web and worker, a PostgreSQL add-on
    (which sets DATABASE_URL), production with generated tokens and signing key."""
    manifest = {
        "name": name,
        "description": "Durable background jobs on PostgreSQL with dygo",
        "buildpacks": [{"url": "heroku/python"}],
        "addons": [{"plan": "heroku-postgresql"}],
        "formation": {"web": {"quantity": 1}, "worker": {"quantity": 1}},
        "env": {
            "DYGO_ENV": {
                "description": "production: tokens required, dev-only operations refused",
                "value": "production",
            },
            "DYGO_ADMIN_TOKEN": {
                "description": "the API's admin bearer token and dashboard sign-in",
                "generator": "secret",
            },
            "DYGO_READ_TOKEN": {"description": "a read-only token", "generator": "secret"},
            "DYGO_SECRET_KEY": {"description": "signs the dashboard's cookies", "generator": "secret"},
            "DYGO_ALLOWED_HOSTS": {
                "description": "Host names `dygo serve` answers (comma-separated; a leading dot: every subdomain)",
                "value": ".herokuapp.com",
            },
        },
    }
    return json.dumps(manifest, indent=2) + "\n"


def project_files(target: Path) -> dict[str, str]:
    """Every file `dygo init` writes into `target`, by its path in the project."""
    return {
        "config/queues.yml": QUEUES_YML,
        "config/dygo.yml": DYGO_YML,
        "config/schedules.yml": SCHEDULES_YML,
        "jobs/__init__.py": JOBS_INIT,
        "jobs/hello.py": JOBS_HELLO,
        "jobs/test_hello.py": JOBS_TEST,
        "Procfile": PROCFILE,
        "requirements.txt": requirements(),
        ".python-version": python_version(),
        "app.json": app_json(target.resolve().name or "dygo-project"),
        ".gitignore": GITIGNORE,
    }


def existing_files(target: Path) -> list[str]:
    """The generated files that are already there (or cannot be created: a folder in the way)."""
    in_the_way = []
    for name in project_files(target):
        folders = [target.joinpath(*Path(name).parts[:depth]) for depth in range(1, len(Path(name).parts))]
        path = target / name
        if path.exists() or path.is_symlink() or any(folder.exists() and not folder.is_dir() for folder in folders):
            in_the_way.append(name)
    return in_the_way


def init_project(directory: str) -> int:
    """Write a new project into `directory` (created when missing); exit 1, writing nothing, when any
    file would be overwritten."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        print(f"dygo init: {target} exists and is not a directory; nothing written", file=sys.stderr)
        return 1
    in_the_way = existing_files(target)
    if in_the_way:
        print(
            f"dygo init: refusing to overwrite existing files in {target}: {', '.join(in_the_way)}; nothing written",
            file=sys.stderr,
        )
        return 1
    for name, text in project_files(target).items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as file:  # "x": never overwrite, even in a race
            file.write(text)
        print(f"  created {target / name}")
    cd = "" if target.resolve() == Path.cwd().resolve() else f"cd {shlex.quote(str(target))} && "
    print("\nNext (PostgreSQL: DATABASE_URL, else an embedded server in .dygo/):")
    print(f"  {cd}dygo migrate")
    print(
        "  DYGO_HOST=127.0.0.1 honcho start --port 8000 web worker   "
        "# the Procfile's web (http://127.0.0.1:8000/dashboard/) and worker"
    )
    print("Deploy: push it to a Heroku-style platform (Procfile, app.json, requirements.txt, .python-version).")
    return 0
