"""The queues: their counts and cluster-wide limits, the limit form, pause and resume, retrying their dead
jobs, and purging or vacuuming them after a confirmation page that counts what goes."""

from __future__ import annotations

from typing import Any

from dygo.app.dashboard.rendering import redirect, render
from dygo.app.dashboard.visitor import Action, Fields, Page, Refused
from dygo.app.db import Conn, ReadConn
from dygo.store import admin, limits
from dygo.store.config import count_from_text
from dygo.store.durations import parse_duration
from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter()


def configured_queues(request: Request) -> dict[str, int]:
    """The configured queues, each with its concurrency."""
    concurrency: dict[str, int] = request.app.state.settings.concurrency
    return concurrency


def _queue(request: Request, conn: Conn, name: str) -> dict[str, Any]:
    queue = admin.find_queue(conn, configured_queues(request), name)
    if queue is None:
        raise Refused(404, "No such queue", f"There is no queue named {name!r}.")
    return queue


@router.get("/queues")
def queues_page(request: Request, visitor: Page, conn: ReadConn) -> Response:
    return render(
        request,
        visitor,
        "queues.html",
        queues=admin.list_queues(conn, configured_queues(request)),
        limits=[use.as_dict() for use in limits.limits_in_use(conn)],
    )


@router.post("/limits")
def change_limit(request: Request, fields: Fields, visitor: Action, conn: Conn) -> Response:
    """Set a queue's or kind's cluster-wide limits from the queues page (empty fields: none)."""
    back = visitor.prefix + "/queues"
    scope, name = fields.get("scope", ""), fields.get("name", "").strip()
    known = configured_queues(request) if scope == "queue" else request.app.state.jobs.kinds()
    if scope not in ("queue", "kind") or name not in known:
        return redirect(visitor, back, f"No {scope or 'queue or kind'} named {name!r} to limit.", "error")
    # The form's limit fields are always sent: an empty one removes that limit (the operator cleared it), both
    # empty remove the limit with its key. The values go through the file's and the API's rules.
    changes: dict[str, Any] = {}
    try:
        for field in ("concurrency_limit", "rate_burst"):
            raw = fields.get(field, "").strip()
            if field in fields or raw:
                changes[field] = count_from_text(field, raw) if raw else None
        changes["rate_limit"] = fields.get("rate_limit", "").strip() or None
        if "key" in fields:  # the new-limit form's; a row's form leaves its key as it is
            changes["key"] = fields["key"].strip() or None
        kept = limits.change_limit(conn, scope, name, changes, list(configured_queues(request)))
    except ValueError as exc:
        return redirect(visitor, back, f"Limit on {scope} {name} not changed: {exc}.", "error")
    if not kept:
        return redirect(visitor, back, f"Limits on {scope} {name} removed.")
    return redirect(visitor, back, f"Limits on {scope} {name} set: workers claim under them within a second.")


@router.get("/queues/{name}/purge")
def purge_confirmation(request: Request, name: str, visitor: Page, conn: Conn) -> Response:
    queue = _queue(request, conn, name)
    counts = queue["counts"]
    to_delete = counts["pending"] + counts["scheduled"] + counts["dead"]
    return render(request, visitor, "purge.html", queue=queue, to_delete=to_delete)


# "Vacuum dead" offers these ages (the API takes any duration): the option, and the jobs it takes.
VACUUM_AGES = {
    "0s": ("all dead jobs", "dead {jobs}"),
    "1h": ("dead for over an hour", "{jobs} dead for over an hour"),
    "1d": ("dead for over a day", "{jobs} dead for over a day"),
    "7d": ("dead for over 7 days", "{jobs} dead for over 7 days"),
    "30d": ("dead for over 30 days", "{jobs} dead for over 30 days"),
}


def _vacuum_age(value: str) -> tuple[str, float]:
    age = value if value in VACUUM_AGES else "7d"
    return age, parse_duration(age)


def _vacuumed(age: str, count: int) -> str:
    """'3 dead jobs', '1 job dead for over a day'."""
    return f"{count} " + VACUUM_AGES[age][1].format(jobs="job" if count == 1 else "jobs")


@router.get("/queues/{name}/vacuum-dead")
def vacuum_confirmation(request: Request, name: str, visitor: Page, conn: Conn, older_than: str = "7d") -> Response:
    queue = _queue(request, conn, name)
    age, seconds = _vacuum_age(older_than)
    to_delete = admin.count_vacuum_dead(conn, name, seconds)
    return render(
        request,
        visitor,
        "vacuum.html",
        queue=queue,
        to_delete=to_delete,
        age=age,
        what=_vacuumed(age, to_delete),
        ages={value: option for value, (option, _) in VACUUM_AGES.items()},
    )


@router.post("/queues/{name}/vacuum-dead")
def vacuum_dead(request: Request, name: str, fields: Fields, visitor: Action, conn: Conn) -> Response:
    _queue(request, conn, name)
    age, seconds = _vacuum_age(fields.get("older_than", ""))
    deleted = admin.vacuum_dead(conn, name, seconds)
    return redirect(visitor, visitor.prefix + "/queues", f"Vacuumed queue {name}: deleted {_vacuumed(age, deleted)}.")


@router.post("/queues/{name}/{action}")
def act_on_queue(request: Request, name: str, action: str, visitor: Action, conn: Conn) -> Response:
    _queue(request, conn, name)
    back = visitor.prefix + "/queues"
    if action == "pause":
        admin.pause_queue(conn, name)
        return redirect(visitor, back, f"Queue {name} paused: workers stop claiming its jobs.")
    if action == "resume":
        admin.resume_queue(conn, name)
        return redirect(visitor, back, f"Queue {name} resumed.")
    if action == "retry-dead":
        retried = admin.retry_dead(conn, name)
        return redirect(visitor, back, f"Retried {retried} dead job{'s' * (retried != 1)} of queue {name}.")
    if action == "purge":
        report = admin.purge_queue(conn, name)
        return redirect(
            visitor,
            back,
            f"Purged queue {name}: deleted {report['pending']} pending, "
            f"{report['scheduled']} scheduled and {report['dead']} dead jobs; "
            f"{report['active_left']} active and {report['paused_left']} paused left alone.",
        )
    return redirect(visitor, back, f"Unknown action {action!r}.", "error")
