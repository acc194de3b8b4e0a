"""The jobs: the filtered list, one job's page and its actions, bulk actions, and the dead letters
grouped by kind and error."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl, urlencode

from dygo.app.dashboard.queues import configured_queues
from dygo.app.dashboard.rendering import redirect, render
from dygo.app.dashboard.visitor import Action, Fields, Page, Refused, Visitor
from dygo.app.db import Conn, ReadConn
from dygo.app.errors import ApiError
from dygo.app.jobs import decode_cursor, encode_cursor
from dygo.store import admin, job_reads, steps, workflows
from dygo.store.errors import Conflict, NotFound
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

PAGE_SIZE = 50
JOB_ACTIONS = {  # action: what the flash says was done
    "retry": "retried",
    "cancel": "cancelled",
    "pause": "paused",
    "resume": "resumed",
    "run-now": "set to run now",
    "archive": "archived",
    "delete": "deleted",
}

router = APIRouter()


def _job_filter(queue: str, kind: str, state: str, q: str) -> admin.JobFilter:
    """A jobs list's filter from its query (or a bulk form's hidden fields): the same for both."""
    return admin.JobFilter(
        queue=queue or None, kind=kind or None, state=state if state in admin.STATES else None, text=q[:255] or None
    )


@router.get("/jobs")
def jobs_page(
    request: Request,
    visitor: Page,
    conn: ReadConn,
    queue: str = "",
    kind: str = "",
    state: str = "",
    q: str = "",
    cursor: str = "",
    parent_id: str = "",
) -> Response:
    where = _job_filter(queue, kind, state, q)
    # A parent's children (the job page's link): not a bulk filter, so the matching-everything actions are off.
    parent = int(parent_id) if parent_id.isdigit() and 0 < int(parent_id) < 2**63 else None
    if parent is not None:
        where = admin.JobFilter(where.queue, where.kind, where.state, where.text, parent_id=parent)
    try:
        position = decode_cursor(cursor, "newest") if cursor else None
    except ApiError:
        return redirect(visitor, visitor.prefix + "/jobs", "That page link is stale; showing the newest jobs.", "error")
    page = admin.list_jobs(conn, where, limit=PAGE_SIZE, position=position)
    filters = {"queue": queue, "kind": kind, "state": state, "q": q}
    next_link = None
    if page.next_position is not None:
        kept = {**filters, "parent_id": str(parent)} if parent is not None else filters
        next_link = "?" + urlencode({**kept, "cursor": encode_cursor("newest", page.next_position)})
    return render(
        request,
        visitor,
        "jobs.html",
        jobs=page.jobs,
        filters=filters,
        next_link=next_link,
        states=admin.STATES,
        parent_id=parent,
        queues=list(configured_queues(request)),
        here=request.url.path + ("?" + request.url.query if request.url.query else ""),
    )


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: int, visitor: Page, conn: Conn) -> Response:
    job = job_reads.get_job(conn, job_id)
    if job is None:
        raise Refused(404, "No such job", f"There is no job with id {job_id}; it may have been deleted.")
    return render(
        request,
        visitor,
        "job.html",
        job=job,
        node=workflows.node_of_job(conn, job_id),
        steps=steps.job_steps(conn, job_id),
        forgettable=steps.FORGETTABLE,
    )


@router.post("/jobs/{job_id}/steps/{key}/retry")
def retry_from_step(job_id: int, key: str, fields: Fields, visitor: Action, conn: Conn) -> Response:
    back = _back(visitor, fields, f"/jobs/{job_id}")
    try:
        forgotten = steps.forget_steps(conn, job_id, key)
    except (NotFound, Conflict) as exc:
        return redirect(visitor, back, f"Job {job_id} was not retried from step {key}: {exc}", "error")
    return redirect(
        visitor,
        back,
        f"Job {job_id}: forgot {len(forgotten.keys)} steps from {key} on ({', '.join(forgotten.keys)}); "
        f"it is now {forgotten.job['state']}.",
    )


@router.post("/jobs/{job_id}/{action}")
def act_on_job(job_id: int, action: str, fields: Fields, visitor: Action, conn: Conn) -> Response:
    back = _back(visitor, fields, f"/jobs/{job_id}")
    if action not in JOB_ACTIONS:
        return redirect(visitor, back, f"Unknown action {action!r}.", "error")
    try:
        if action == "delete":
            admin.delete_job(conn, job_id)
            return redirect(visitor, _back(visitor, fields, "/jobs", deleted=job_id), f"Job {job_id} deleted.")
        job = admin.act_on_job(conn, action, job_id)
    except (NotFound, Conflict) as exc:
        return redirect(visitor, back, f"Job {job_id} was not {JOB_ACTIONS[action]}: {exc}", "error")
    return redirect(visitor, back, f"Job {job_id} {JOB_ACTIONS[action]}; it is now {job['state']}.")


def _back(visitor: Visitor, fields: dict[str, str], default: str, deleted: int | None = None) -> str:
    """Where a form asked to return to (a dashboard page only), else the default (a path below the dashboard's)."""
    wanted, default = fields.get("back", ""), visitor.prefix + default
    if deleted is not None and wanted.startswith(f"{visitor.prefix}/jobs/{deleted}"):
        return default
    return wanted if wanted.startswith(visitor.prefix + "/") and "//" not in wanted else default


# --- bulk actions on jobs ----------------------------------------------------------------------------
# On the rows ticked on a jobs page, or on every job matching its filter after a confirmation page
# that counts them. One statement each (store.admin.bulk_act); the flash says changed vs skipped.

# What the dashboard says of each of store.admin's bulk actions: its button, its past tense, and which
# jobs it applies to.
BULK_ACTION_WORDING = {
    "retry": ("Retry", "Retried", "dead or cancelled"),
    "cancel": ("Cancel", "Cancelled", "pending, scheduled or paused"),
    "archive": ("Archive", "Archived", "pending or scheduled"),
    "delete": ("Delete", "Deleted", "not active"),
}
BULK_MAX_TICKED = 500


async def form_lists(request: Request) -> dict[str, list[str]]:
    """The form body with repeated fields kept (the ticked `id` checkboxes)."""
    body = (await request.body()).decode("utf-8", "replace")
    lists: dict[str, list[str]] = {}
    for name, value in parse_qsl(body, keep_blank_values=True):
        lists.setdefault(name, []).append(value)
    return lists


def _bulk_action(action: str) -> tuple[str, str, str]:
    if action not in BULK_ACTION_WORDING:
        raise Refused(404, "No such action", f"There is no bulk action {action!r}.")
    return BULK_ACTION_WORDING[action]


def _bulk_message(action: str, report: admin.BulkReport, what: str) -> str:
    _, done, rule = BULK_ACTION_WORDING[action]
    return (
        f"{done} {report.changed} of {report.matched} {what}; {report.skipped} skipped "
        f"({action} applies to jobs that are {rule})."
    )


@router.post("/bulk/{action}")
def bulk_selected(
    action: str,
    fields: Fields,
    lists: Annotated[dict[str, list[str]], Depends(form_lists)],
    visitor: Action,
    conn: Conn,
) -> Response:
    _bulk_action(action)
    back = _back(visitor, fields, "/jobs")
    ids = sorted({int(v) for v in lists.get("id", []) if v.isdigit() and len(v) < 19})
    if not ids:
        return redirect(visitor, back, "Tick at least one job first.", "error")
    if len(ids) > BULK_MAX_TICKED:
        return redirect(
            visitor,
            back,
            f"At most {BULK_MAX_TICKED} ticked jobs at a time; use “everything matching the filter” for more.",
            "error",
        )
    try:
        report = admin.bulk_act(conn, action, ids=ids)
    except Conflict as exc:
        return redirect(visitor, back, f"Nothing changed: {exc}", "error")
    return redirect(visitor, back, _bulk_message(action, report, "selected jobs"))


def _filter_fields(source: dict[str, str]) -> dict[str, str]:
    """The filter fields as _job_filter reads them (an unknown state is no state filter, shown as none)."""
    fields = {name: source.get(name, "") for name in ("queue", "kind", "state", "q")}
    if fields["state"] not in admin.STATES:
        fields["state"] = ""
    return fields


def _shown_filters(visitor: Visitor, filters: dict[str, str]) -> tuple[dict[str, str], str]:
    """The filters that are set, and the jobs page they filter (where a bulk action returns to)."""
    shown = {name: value for name, value in filters.items() if value}
    return shown, visitor.prefix + "/jobs" + ("?" + urlencode(shown) if shown else "")


@router.get("/bulk/{action}/confirm")
def bulk_confirmation(request: Request, action: str, visitor: Page, conn: Conn) -> Response:
    label, done, rule = _bulk_action(action)
    filters = _filter_fields(dict(request.query_params))
    matched, changing, more = admin.count_matching(conn, action, _job_filter(**filters))
    shown, back = _shown_filters(visitor, filters)
    return render(
        request,
        visitor,
        "bulk.html",
        action=action,
        label=label,
        done=done.lower(),
        rule=rule,
        filters=filters,
        shown=shown,
        matched=matched,
        changing=changing,
        more=more,
        limit=admin.BULK_LIMIT,
        back=back,
    )


@router.post("/bulk/{action}/matching")
def bulk_matching(action: str, fields: Fields, visitor: Action, conn: Conn) -> Response:
    _bulk_action(action)
    filters = _filter_fields(fields)
    _, back = _shown_filters(visitor, filters)
    try:
        report = admin.bulk_act(conn, action, where=_job_filter(**filters))
    except Conflict as exc:
        return redirect(visitor, back, f"Nothing changed: {exc}", "error")
    return redirect(visitor, back, _bulk_message(action, report, "jobs matching the filter"))


# --- dead letters -------------------------------------------------------------------------------------


DEAD_GROUPS_SHOWN = 100


@router.get("/dead")
def dead_page(request: Request, visitor: Page, conn: ReadConn) -> Response:
    groups = admin.dead_letter_groups(conn, DEAD_GROUPS_SHOWN)
    return render(request, visitor, "dead.html", groups=groups, capped=len(groups) == DEAD_GROUPS_SHOWN)


@router.post("/dead/retry")
def retry_dead_group(fields: Fields, visitor: Action, conn: Conn) -> Response:
    kind, fingerprint = fields.get("kind", ""), fields.get("fingerprint", "")
    retried = admin.retry_dead_group(conn, kind, fingerprint)
    return redirect(
        visitor,
        visitor.prefix + "/dead",
        f"Retried {retried} dead {kind} job{'s' * (retried != 1)} failing with “{fingerprint}”.",
    )
