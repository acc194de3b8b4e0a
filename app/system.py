"""Health, readiness, live workers, and the development-only nuke."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from dygo.app.db import Conn, ReadConn, SyncSlot
from dygo.app.errors import ApiError, documented, error_response
from dygo.app.schemas import Health, NukeReport, Ready, WorkerList
from dygo.store import admin
from dygo.store.errors import SchemaError
from dygo.store.outage import is_outage
from fastapi import APIRouter, Request

log = logging.getLogger("dygo.serve")

router = APIRouter(tags=["system"])

# Workers heartbeat every 5 s; one unseen for this long is gone (crashed without saying so).
WORKER_SEEN_WITHIN = 30.0


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Ready,
    summary="Readiness: the database answers and its schema is current",
    responses=documented(503),
)
def readyz(request: Request, _: SyncSlot) -> Any:
    try:
        with request.app.state.db.pool.connection(timeout=5) as conn:
            version = admin.check_ready(conn)
    except SchemaError as exc:
        return error_response(503, "not_ready", str(exc), {"check": "schema"})
    except psycopg.Error as exc:
        if not is_outage(exc):
            raise  # a privilege or the schema, not an outage: the server's 500 handler logs it
        # Load balancers poll this every few seconds: an outage is logged once, not per poll.
        request.app.state.outage.lost("readiness check", exc)
        return error_response(503, "not_ready", "the database is not reachable", {"check": "database"})
    request.app.state.outage.back()
    return {"status": "ready", "schema_version": version}


@router.get(
    "/api/v1/workers",
    response_model=WorkerList,
    summary="Worker processes seen in the last 30 seconds",
    responses=documented(401, 403, 503),
)
def workers(conn: ReadConn) -> dict[str, Any]:
    return {"workers": admin.live_workers(conn, WORKER_SEEN_WITHIN)}


@router.post(
    "/api/v1/nuke",
    response_model=NukeReport,
    summary="Delete every job, key, stat and queue pause (development only)",
    responses=documented(401, 403, 503),
)
def nuke(request: Request, conn: Conn) -> dict[str, int]:
    env = request.app.state.settings.env
    if env != "development":
        raise ApiError(
            403, "development_only", f"nuke is refused in the {env} environment; it only runs in development"
        )
    report = admin.nuke(conn)
    log.warning("nuke: deleted %s", report)
    return report
