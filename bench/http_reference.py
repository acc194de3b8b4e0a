"""The ceiling for bench/http_bench.py: a bare FastAPI app that inserts the row dygo would insert, and nothing else.

    .venv/bin/python bench/http_reference.py --url URL --port N [--pool-size N]

FastAPI + psycopg AsyncConnectionPool + one statement per request, run by uvicorn with the
settings `dygo serve` uses (uvicorn.run(app, log_level="info", log_config=None), dygo's logging,
so access lines are written the same way). No auth, no validation beyond the body model, no
tracing, no idempotency: what is left is the HTTP stack, the driver and PostgreSQL.

- POST /jobs  {"kind", "args"}: store/sql/enqueue.py's INSERT_JOB, the statement of dygo's single enqueue;
- POST /jobs/batch  {"jobs": [{"kind", "args"}, ...]}: one INSERT of all the rows (unnest of one array
  per column), one round trip: faster than 100 pipelined single INSERTs, which an earlier version of
  this reference used.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn  # noqa: E402
from dygo.store.sql.enqueue import INSERT_JOB  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from dygo.logs import configure_logging  # noqa: E402

# The reference's own statement (bench-only): the rows of INSERT_JOB, all in one statement.
INSERT_JOBS = """
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts)
SELECT kind, 'default', args, '{}', 0, now(), 20 FROM unnest(%s::text[], %s::jsonb[]) AS t(kind, args)
RETURNING id, run_at"""


class Job(BaseModel):
    kind: str
    args: dict[str, Any] = {}


class Batch(BaseModel):
    jobs: list[Job]


def row(job: Job) -> dict[str, Any]:
    return {
        "kind": job.kind,
        "queue": "default",
        "args": json.dumps(job.args),
        "meta": "{}",
        "priority": 0,
        "run_at": None,
        "delay": 0.0,
        "max_attempts": 20,
    }


def create_app(url: str, pool_size: int) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": True}
        )
        await app.state.pool.open()
        yield
        await app.state.pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/jobs", status_code=201)
    async def enqueue(job: Job) -> JSONResponse:
        async with app.state.pool.connection() as conn:
            job_id, run_at = await (await conn.execute(INSERT_JOB, row(job))).fetchone()
        return JSONResponse({"id": job_id, "deduplicated": False, "run_at": run_at.isoformat()}, status_code=201)

    @app.post("/jobs/batch", status_code=201)
    async def enqueue_batch(batch: Batch) -> dict[str, Any]:
        kinds = [job.kind for job in batch.jobs]
        args = [json.dumps(job.args) for job in batch.jobs]
        async with app.state.pool.connection() as conn:
            rows = await (await conn.execute(INSERT_JOBS, (kinds, args))).fetchall()
        return {
            "jobs": [{"id": job_id, "deduplicated": False, "run_at": run_at.isoformat()} for job_id, run_at in rows]
        }

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool-size", type=int, default=8)
    args = parser.parse_args()
    configure_logging("text")
    uvicorn.run(
        create_app(args.url, args.pool_size), host="127.0.0.1", port=args.port, log_level="info", log_config=None
    )


if __name__ == "__main__":
    main()
