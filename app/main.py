"""The admin service: a FastAPI app over the store. It never runs jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from store import inspect
from store.config import Settings
from store.enqueue import enqueue
from store.errors import EnqueueError
from store.registry import Registry


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        self.status, self.code, self.message, self.details = status, code, message, details
        super().__init__(message)


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


class EnqueueBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="A registered job kind, e.g. 'email.send'")
    args: dict[str, Any] = Field(default_factory=dict, description="Validated against the kind's args model")
    queue: str | None = Field(None, description="Defaults to the kind's queue")
    priority: int | None = Field(None, description="Higher runs first; -1000 to 1000")
    run_at: datetime | None = Field(None, description="When to run, with a timezone")
    delay: str | float | None = Field(None, description="Run after this long, e.g. '30s' (database clock)")
    max_attempts: int | None = None
    meta: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, description="Deduplicates while a live job holds the key")
    idempotency_ttl: str | float | None = Field(None, description="Keeps the key for this long, even after completion")


def create_app(settings: Settings, jobs: Registry, database_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = ConnectionPool(database_url, min_size=1, max_size=10,
                                        kwargs={"autocommit": True}, open=True)
        try:
            yield
        finally:
            app.state.pool.close()

    app = FastAPI(title="dygo", version="1", lifespan=lifespan,
                  description="Durable background jobs on PostgreSQL: the admin API.")

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message, exc.details), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(error_body("invalid_request", "the request body or parameters are invalid", details),
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(psycopg.OperationalError)
    async def database_down(_: Request, exc: psycopg.OperationalError) -> JSONResponse:
        return JSONResponse(error_body("database_unavailable", "the database is not reachable; try again shortly"),
                            status_code=503)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body("internal_error", "an unexpected error occurred; see the server log"),
                            status_code=500)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/jobs", status_code=201, tags=["jobs"])
    def enqueue_job(body: EnqueueBody, request: Request) -> JSONResponse:
        options = body.model_dump(exclude={"kind", "args"}, exclude_none=True)
        try:
            with request.app.state.pool.connection() as conn:
                result = enqueue(conn, body.kind, body.args, **options)
        except EnqueueError as exc:
            raise ApiError(422, exc.code, str(exc), exc.details) from None
        payload = {"id": result.id, "deduplicated": result.deduplicated,
                   "run_at": result.run_at.isoformat() if result.run_at else None}
        return JSONResponse(payload, status_code=200 if result.deduplicated else 201)

    @app.get("/api/v1/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: int, request: Request) -> dict[str, Any]:
        with request.app.state.pool.connection() as conn:
            job = inspect.get_job(conn, job_id)
        if job is None:
            raise ApiError(404, "job_not_found", f"no job with id {job_id}")
        return job

    return app
