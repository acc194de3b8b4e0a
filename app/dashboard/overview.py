"""The overview: every queue's counts, the live workers, queue lag, failing kinds and the throughput
charts, with the fragments its page polls (`/live`, `/live/minutes`)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from dygo.app import charts
from dygo.app.dashboard.queues import configured_queues
from dygo.app.dashboard.rendering import render
from dygo.app.dashboard.visitor import Page
from dygo.app.db import Conn, ReadConn, database
from dygo.app.system import WORKER_SEEN_WITHIN
from dygo.store import admin
from fastapi import APIRouter, Request
from fastapi.responses import Response

THROUGHPUT_MINUTES = 60
THROUGHPUT_DAYS = 30

router = APIRouter()


def _overview(request: Request, conn: Conn) -> dict[str, Any]:
    queues = admin.list_queues(conn, configured_queues(request))
    totals = {state: sum(q["counts"][state] for q in queues) for state in admin.COUNTED_STATES}
    return {
        "queues": queues,
        "totals": totals,
        "states": admin.COUNTED_STATES,
        "workers": admin.live_workers(conn, WORKER_SEEN_WITHIN),
        "lag": admin.queue_lag(conn),
    }


def throughput_charts(conn: Conn, days: bool = True) -> dict[str, charts.Chart]:
    """Per minute for the last hour and (with `days`) per day for the last 30 days, from the rollups."""
    minutes = admin.minute_stats(conn, THROUGHPUT_MINUTES)
    drawn = {
        "minute_chart": charts.throughput_chart(
            "minutes",
            "Per minute, last hour",
            minutes,
            "minute",
            lambda at: at.astimezone(UTC).strftime("%H:%M"),
            10,
            "lines",
        )
    }
    if days:
        daily = admin.daily_stats(conn, None, THROUGHPUT_DAYS)["daily"]
        drawn["day_chart"] = charts.throughput_chart(
            "days", f"Per day, last {THROUGHPUT_DAYS} days", daily, "day", lambda day: day.strftime("%b %-d"), 7, "bars"
        )
    return drawn


@router.get("/")
def overview(request: Request, visitor: Page, conn: ReadConn) -> Response:
    if not database(request).reads_replica:
        # Fresh numbers; skipped harmlessly while another process folds. A replica cannot fold: there the
        # charts show what serve's own fold (every 30 s) has replicated.
        admin.fold_stats(conn)
    charts_drawn: dict[str, Any] = throughput_charts(conn)
    return render(
        request,
        visitor,
        "overview.html",
        failing=admin.failing_kinds(conn),
        **charts_drawn,
        **_overview(request, conn),
    )


@router.get("/live")
def overview_live(request: Request, visitor: Page, conn: ReadConn) -> Response:
    """The overview's counts and workers alone, polled by the overview page."""
    return render(request, visitor, "_live.html", **_overview(request, conn))


@router.get("/live/minutes")
def overview_live_minutes(request: Request, visitor: Page, conn: ReadConn) -> Response:
    """The per-minute chart alone, polled by the overview page (rollups plus unfolded deltas: no fold needed)."""
    return render(request, visitor, "_minutes.html", minute_chart=throughput_charts(conn, days=False)["minute_chart"])
