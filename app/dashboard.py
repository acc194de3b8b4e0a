"""The dashboard: server-rendered pages under /dashboard over the same store functions as the API.

Who may do what follows app.auth: with no token configured (development only) the dashboard is
open with admin rights; otherwise a visitor logs in with an API token, and a `read` token sees
every page but no action buttons, and is refused if it posts anyway. Every form carries a CSRF
token; every action redirects back with a flash message saying what changed.
"""

from __future__ import annotations

import hmac
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

import psycopg
from dygo.app import charts
from dygo.app.auth import Tokens
from dygo.app.db import Conn
from dygo.app.errors import ApiError
from dygo.app.jobs import decode_cursor, encode_cursor
from dygo.app.session import FLASH_COOKIE, SESSION_COOKIE, SESSION_SECONDS, Session, Signer, secret_key
from dygo.app.system import WORKER_SEEN_WITHIN
from dygo.app.throttle import AuthThrottle
from dygo.store import admin, auth_state, inspect, limits, schedules
from dygo.store.durations import parse_duration
from dygo.store.errors import Conflict, EnqueueError, NotFound
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

PREFIX = "/dashboard"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
PAGE_SIZE = 50
JOB_ACTIONS = {
    "retry": "retried",
    "cancel": "cancelled",
    "pause": "paused",
    "resume": "resumed",
    "run-now": "set to run now",
    "archive": "archived",
    "delete": "deleted",
}
QUEUE_ACTIONS = ("pause", "resume", "purge", "retry-dead")
SCHEDULE_ACTIONS = ("pause", "resume", "trigger")

templates = Jinja2Templates(directory=str(TEMPLATES))
router = APIRouter(prefix=PREFIX, include_in_schema=False)


class Refused(Exception):
    """Rendered as a friendly HTML page with this status, never a stack trace."""

    def __init__(self, status: int, title: str, message: str) -> None:
        self.status, self.title, self.message = status, title, message
        super().__init__(message)


class LoginRequired(Exception):
    pass


# --- the visitor: session, role, CSRF ------------------------------------------------------------


class Visitor:
    """Who is asking, from the session cookie. `verify` (every page and action, through the `visitor`
    dependency) checks a signed-in session against the database and the configured tokens; error pages
    skip it (they show nothing)."""

    def __init__(self, request: Request) -> None:
        state = request.app.state
        self.state = state
        self.tokens: Tokens = state.dashboard_tokens
        self.signer: Signer = state.dashboard_signer
        found = Session.read(self.signer, request.cookies.get(SESSION_COOKIE))
        self.session = found or Session.new()
        self.fresh = found is None
        self.secure = request.url.scheme == "https"

    async def verify(self) -> None:
        """Signed out, or its token rotated out: a fresh, anonymous session. On the event loop, with the
        hot async pool: a page's thread never waits for a connection (app/db.py)."""
        session = self.session
        if session.role is None or not self.tokens.enabled:
            return
        if self.tokens.role_of_fingerprint(session.token) == session.role:
            async with self.state.db.connection() as conn:
                if await auth_state.asession_role(conn, session.sid) == session.role:
                    return
        self.session, self.fresh = Session.new(), True

    @property
    def role(self) -> str | None:
        return self.session.role if self.tokens.enabled else "admin"

    @property
    def can_act(self) -> bool:
        return self.role == "admin"

    @property
    def csrf(self) -> str:
        return self.signer.csrf_token(self.session.sid)

    def start(self, conn: psycopg.Connection, role: str, token: str) -> None:
        """A new session id at login, so a session id planted before it is worthless after; recorded in
        the database, where signing out deletes it."""
        self.session, self.fresh = Session.new(role, self.tokens.fingerprint(token)), True
        auth_state.start_session(conn, self.session.sid, role, self.session.expires)

    def end(self, conn: psycopg.Connection) -> None:
        if self.session.role is not None and self.tokens.enabled:
            auth_state.end_session(conn, self.session.sid)
        self.session, self.fresh = Session.new(), True

    def keep(self, response: Response) -> Response:
        if self.fresh:
            response.set_cookie(
                SESSION_COOKIE,
                self.session.dump(self.signer),
                max_age=SESSION_SECONDS,
                path=PREFIX,
                httponly=True,
                samesite="lax",
                secure=self.secure,
            )
        return response


async def visitor(request: Request) -> Visitor:
    who = Visitor(request)
    await who.verify()
    return who


async def signed_in(request: Request) -> Visitor:
    """The visitor of a page: logged in, or sent to the login page."""
    who = await visitor(request)
    if who.role is None:
        raise LoginRequired()
    return who


async def form_fields(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (every dashboard form is one)."""
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def checked_form(fields: dict[str, str], who: Visitor) -> dict[str, str]:
    presented = fields.get("csrf", "").encode("utf-8", "surrogateescape")
    if who.fresh or not hmac.compare_digest(presented, who.csrf.encode()):
        raise Refused(
            403,
            "This form has expired",
            "The form was not sent from this dashboard session (missing or stale CSRF token). "
            "Go back, reload the page and try again.",
        )
    return fields


def acting(
    fields: Annotated[dict[str, str], Depends(form_fields)], who: Annotated[Visitor, Depends(signed_in)]
) -> Visitor:
    """The visitor of an action: a checked CSRF token and an admin role."""
    checked_form(fields, who)
    if not who.can_act:
        raise Refused(
            403,
            "Read-only access",
            "You are signed in with a read-only token; changing jobs, queues or schedules needs an admin token.",
        )
    return who


Page = Annotated[Visitor, Depends(signed_in)]
Action = Annotated[Visitor, Depends(acting)]
Fields = Annotated[dict[str, str], Depends(form_fields)]


# --- rendering -------------------------------------------------------------------------------------


def render(request: Request, who: Visitor, template: str, status: int = 200, **context: Any) -> Response:
    flash = who.signer.loads(request.cookies.get(FLASH_COOKIE))
    response = templates.TemplateResponse(
        request,
        template,
        {"who": who, "csrf": who.csrf, "flash": flash, "prefix": PREFIX, **context},
        status_code=status,
    )
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=PREFIX)
    return who.keep(response)


def redirect(who: Visitor, to: str, message: str, level: str = "ok") -> Response:
    response = RedirectResponse(to, status_code=303)
    response.set_cookie(
        FLASH_COOKIE,
        who.signer.dumps({"message": message, "level": level}),
        max_age=60,
        path=PREFIX,
        httponly=True,
        samesite="lax",
        secure=who.secure,
    )
    return who.keep(response)


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    who = Visitor(request)  # unverified: from exception handlers, maybe with the database down
    return templates.TemplateResponse(
        request,
        "error.html",
        {"who": who, "csrf": who.csrf, "flash": None, "prefix": PREFIX, "title": title, "message": message},
        status_code=status,
    )


def _span(seconds: float | None) -> str:
    """A duration, short: 45s, 3m, 2h, 4d."""
    if seconds is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def _ago(value: datetime | None) -> str:
    """How long ago (or, for a time still to come, in how long), short: '3m ago', 'in 2h'."""
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    return f"in {_span(-seconds)}" if seconds < 0 else f"{_span(seconds)} ago"


templates.env.filters["ago"] = _ago
templates.env.filters["span"] = _span
templates.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, default=str, ensure_ascii=False)
templates.env.filters["stamp"] = lambda value: value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


# --- login ------------------------------------------------------------------------------------------


def _next_page(value: str | None) -> str:
    return value if value and value.startswith(PREFIX + "/") and "//" not in value else PREFIX + "/"


@router.get("/login")
def login_page(request: Request, who: Annotated[Visitor, Depends(visitor)], next: str | None = None) -> Response:
    if not who.tokens.enabled:
        return RedirectResponse(PREFIX + "/", status_code=303)
    return render(request, who, "login.html", next=_next_page(next))


def _in_words(seconds: float) -> str:
    """'45 seconds', '1 minute', '5 minutes' (rounded up: never sooner than said)."""
    if seconds < 60:
        count, unit = max(1, math.ceil(seconds)), "second"
    else:
        count, unit = math.ceil(seconds / 60), "minute"
    return f"{count} {unit}{'s' * (count != 1)}"


def _locked_out(request: Request, who: Visitor, until: float) -> Response:
    wait = max(1, math.ceil(until - time.time()))
    at = datetime.fromtimestamp(until, UTC).strftime("%H:%M:%S UTC")
    throttle: AuthThrottle = request.app.state.auth_throttle
    response = render(
        request,
        who,
        "error.html",
        status=429,
        title="Too many failed sign-ins",
        message=f"There were {throttle.attempts} failed sign-ins from your address within "
        f"{_in_words(throttle.window)}, so signing in from it is paused. Try again in "
        f"{_in_words(wait)} (at {at}); check that you paste the whole API token.",
    )
    response.headers["Retry-After"] = str(wait)
    return response


@router.post("/login")
def login(request: Request, fields: Fields, who: Annotated[Visitor, Depends(visitor)], conn: Conn) -> Response:
    throttle: AuthThrottle = request.app.state.auth_throttle
    address = request.client.host if request.client else "unknown"
    if who.tokens.enabled and (until := throttle.locked_until_on(conn, address)) is not None:
        return _locked_out(request, who, until)  # even a right token: guessing must not pay off
    checked_form(fields, who)
    token = fields.get("token", "").strip()
    role = who.tokens.role_of(token) if who.tokens.enabled else "admin"
    if role is None:
        if (until := throttle.failed_on(conn, address)) is not None:
            return _locked_out(request, who, until)
        return render(
            request,
            who,
            "login.html",
            status=401,
            next=_next_page(fields.get("next")),
            error="That token is not valid.",
        )
    if who.tokens.enabled:
        throttle.succeeded_on(conn, address)
        who.start(conn, role, token)
    return redirect(who, _next_page(fields.get("next")), f"Signed in ({role}).")


@router.post("/logout")
def logout(request: Request, fields: Fields, who: Annotated[Visitor, Depends(visitor)], conn: Conn) -> Response:
    checked_form(fields, who)
    who.end(conn)
    return redirect(who, PREFIX + "/login", "Signed out.")


# --- overview -----------------------------------------------------------------------------------------


def _configured(request: Request) -> dict[str, int]:
    return request.app.state.settings.concurrency


def _overview(request: Request, conn: Conn) -> dict[str, Any]:
    queues = admin.list_queues(conn, _configured(request))
    totals = {state: sum(q["counts"][state] for q in queues) for state in admin.COUNTED_STATES}
    return {
        "queues": queues,
        "totals": totals,
        "states": admin.COUNTED_STATES,
        "workers": admin.live_workers(conn, WORKER_SEEN_WITHIN),
        "lag": admin.queue_lag(conn),
    }


THROUGHPUT_MINUTES = 60
THROUGHPUT_DAYS = 30


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
def overview(request: Request, who: Page, conn: Conn) -> Response:
    admin.fold_stats(conn)  # fresh numbers; skipped harmlessly while another process folds
    return render(
        request,
        who,
        "overview.html",
        failing=admin.failing_kinds(conn),
        **throughput_charts(conn),
        **_overview(request, conn),
    )


@router.get("/live")
def overview_live(request: Request, who: Page, conn: Conn) -> Response:
    """The overview's counts and workers alone, polled by the overview page."""
    return render(request, who, "_live.html", **_overview(request, conn))


@router.get("/live/minutes")
def overview_live_minutes(request: Request, who: Page, conn: Conn) -> Response:
    """The per-minute chart alone, polled by the overview page (rollups plus unfolded deltas: no fold needed)."""
    return render(request, who, "_minutes.html", minute_chart=throughput_charts(conn, days=False)["minute_chart"])


# --- jobs ---------------------------------------------------------------------------------------------


def _job_filter(queue: str, kind: str, state: str, q: str) -> admin.JobFilter:
    """A jobs list's filter from its query (or a bulk form's hidden fields): the same for both."""
    return admin.JobFilter(
        queue=queue or None, kind=kind or None, state=state if state in admin.STATES else None, text=q[:255] or None
    )


@router.get("/jobs")
def jobs_page(
    request: Request,
    who: Page,
    conn: Conn,
    queue: str = "",
    kind: str = "",
    state: str = "",
    q: str = "",
    cursor: str = "",
) -> Response:
    where = _job_filter(queue, kind, state, q)
    try:
        position = decode_cursor(cursor, "newest") if cursor else None
    except ApiError:
        return redirect(who, PREFIX + "/jobs", "That page link is stale; showing the newest jobs.", "error")
    page = admin.list_jobs(conn, where, limit=PAGE_SIZE, position=position)
    filters = {"queue": queue, "kind": kind, "state": state, "q": q}
    next_link = None
    if page.next_position is not None:
        next_link = "?" + urlencode({**filters, "cursor": encode_cursor("newest", page.next_position)})
    return render(
        request,
        who,
        "jobs.html",
        jobs=page.jobs,
        filters=filters,
        next_link=next_link,
        states=admin.STATES,
        queues=list(_configured(request)),
        here=request.url.path + ("?" + request.url.query if request.url.query else ""),
    )


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: int, who: Page, conn: Conn) -> Response:
    job = inspect.get_job(conn, job_id)
    if job is None:
        raise Refused(404, "No such job", f"There is no job with id {job_id}; it may have been deleted.")
    return render(request, who, "job.html", job=job)


@router.post("/jobs/{job_id}/{action}")
def act_on_job(job_id: int, action: str, fields: Fields, who: Action, conn: Conn) -> Response:
    back = _back(fields, f"{PREFIX}/jobs/{job_id}")
    if action not in JOB_ACTIONS:
        return redirect(who, back, f"Unknown action {action!r}.", "error")
    try:
        if action == "delete":
            admin.delete_job(conn, job_id)
            return redirect(who, _back(fields, f"{PREFIX}/jobs", deleted=job_id), f"Job {job_id} deleted.")
        job = admin.act_on_job(conn, action, job_id)
    except (NotFound, Conflict) as exc:
        return redirect(who, back, f"Job {job_id} was not {JOB_ACTIONS[action]}: {exc}", "error")
    return redirect(who, back, f"Job {job_id} {JOB_ACTIONS[action]}; it is now {job['state']}.")


def _back(fields: dict[str, str], default: str, deleted: int | None = None) -> str:
    """Where a form asked to return to (a dashboard page only), else the default."""
    wanted = fields.get("back", "")
    if deleted is not None and wanted.startswith(f"{PREFIX}/jobs/{deleted}"):
        return default
    return wanted if wanted.startswith(PREFIX + "/") and "//" not in wanted else default


# --- bulk actions on jobs ----------------------------------------------------------------------------
# On the rows ticked on a jobs page, or on every job matching its filter after a confirmation page
# that counts them. One statement each (store.admin.bulk_act); the flash says changed vs skipped.

BULK_ACTIONS = {  # action: (button, past tense, which jobs it applies to)
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
    if action not in BULK_ACTIONS:
        raise Refused(404, "No such action", f"There is no bulk action {action!r}.")
    return BULK_ACTIONS[action]


def _bulk_message(action: str, report: admin.BulkReport, what: str) -> str:
    _, done, rule = BULK_ACTIONS[action]
    return (
        f"{done} {report.changed} of {report.matched} {what}; {report.skipped} skipped "
        f"({action} applies to jobs that are {rule})."
    )


@router.post("/bulk/{action}")
def bulk_selected(
    action: str, fields: Fields, lists: Annotated[dict[str, list[str]], Depends(form_lists)], who: Action, conn: Conn
) -> Response:
    _bulk_action(action)
    back = _back(fields, PREFIX + "/jobs")
    ids = sorted({int(v) for v in lists.get("id", []) if v.isdigit() and len(v) < 19})
    if not ids:
        return redirect(who, back, "Tick at least one job first.", "error")
    if len(ids) > BULK_MAX_TICKED:
        return redirect(
            who,
            back,
            f"At most {BULK_MAX_TICKED} ticked jobs at a time; use “everything matching the filter” for more.",
            "error",
        )
    try:
        report = admin.bulk_act(conn, action, ids=ids)
    except Conflict as exc:
        return redirect(who, back, f"Nothing changed: {exc}", "error")
    return redirect(who, back, _bulk_message(action, report, "selected jobs"))


def _filter_fields(source: dict[str, str]) -> dict[str, str]:
    """The filter fields as _job_filter reads them (an unknown state is no state filter, shown as none)."""
    fields = {name: source.get(name, "") for name in ("queue", "kind", "state", "q")}
    if fields["state"] not in admin.STATES:
        fields["state"] = ""
    return fields


def _shown_filters(filters: dict[str, str]) -> tuple[dict[str, str], str]:
    """The filters that are set, and the jobs page they filter (where a bulk action returns to)."""
    shown = {name: value for name, value in filters.items() if value}
    return shown, PREFIX + "/jobs" + ("?" + urlencode(shown) if shown else "")


@router.get("/bulk/{action}/confirm")
def bulk_confirmation(request: Request, action: str, who: Page, conn: Conn) -> Response:
    label, done, rule = _bulk_action(action)
    filters = _filter_fields(dict(request.query_params))
    matched, changing, more = admin.count_matching(conn, action, _job_filter(**filters))
    shown, back = _shown_filters(filters)
    return render(
        request,
        who,
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
def bulk_matching(action: str, fields: Fields, who: Action, conn: Conn) -> Response:
    _bulk_action(action)
    filters = _filter_fields(fields)
    _, back = _shown_filters(filters)
    try:
        report = admin.bulk_act(conn, action, where=_job_filter(**filters))
    except Conflict as exc:
        return redirect(who, back, f"Nothing changed: {exc}", "error")
    return redirect(who, back, _bulk_message(action, report, "jobs matching the filter"))


# --- dead letters -------------------------------------------------------------------------------------


DEAD_GROUPS_SHOWN = 100


@router.get("/dead")
def dead_page(request: Request, who: Page, conn: Conn) -> Response:
    groups = admin.dead_letter_groups(conn, DEAD_GROUPS_SHOWN)
    return render(request, who, "dead.html", groups=groups, capped=len(groups) == DEAD_GROUPS_SHOWN)


@router.post("/dead/retry")
def retry_dead_group(fields: Fields, who: Action, conn: Conn) -> Response:
    kind, fingerprint = fields.get("kind", ""), fields.get("fingerprint", "")
    retried = admin.retry_dead_group(conn, kind, fingerprint)
    return redirect(
        who, PREFIX + "/dead", f"Retried {retried} dead {kind} job{'s' * (retried != 1)} failing with “{fingerprint}”."
    )


# --- queues -------------------------------------------------------------------------------------------


def _queue(request: Request, conn: Conn, name: str) -> dict[str, Any]:
    queue = admin.find_queue(conn, _configured(request), name)
    if queue is None:
        raise Refused(404, "No such queue", f"There is no queue named {name!r}.")
    return queue


@router.get("/queues")
def queues_page(request: Request, who: Page, conn: Conn) -> Response:
    return render(
        request,
        who,
        "queues.html",
        queues=admin.list_queues(conn, _configured(request)),
        limits=[use.as_dict() for use in limits.limits_in_use(conn)],
    )


@router.post("/limits")
def change_limit(request: Request, fields: Fields, who: Action, conn: Conn) -> Response:
    """Set a queue's or kind's cluster-wide limits from the queues page (empty fields: none)."""
    back = PREFIX + "/queues"
    scope, name = fields.get("scope", ""), fields.get("name", "").strip()
    known = _configured(request) if scope == "queue" else request.app.state.jobs.kinds()
    if scope not in ("queue", "kind") or name not in known:
        return redirect(who, back, f"No {scope or 'queue or kind'} named {name!r} to limit.", "error")
    raw = fields.get("concurrency_limit", "").strip()
    try:
        concurrency = int(raw) if raw else None
    except ValueError:
        return redirect(who, back, f"concurrency_limit {raw!r} must be an integer greater than 0.", "error")
    rate = fields.get("rate_limit", "").strip() or None
    key = fields.get("key", "").strip() or None
    try:
        limits.set_limit(conn, scope, name, concurrency, rate, key, list(_configured(request)))
    except ValueError as exc:
        return redirect(who, back, f"Limit on {scope} {name} not changed: {exc}.", "error")
    if concurrency is None and rate is None:
        return redirect(who, back, f"Limits on {scope} {name} removed.")
    return redirect(who, back, f"Limits on {scope} {name} set: workers claim under them within a second.")


@router.get("/queues/{name}/purge")
def purge_confirmation(request: Request, name: str, who: Page, conn: Conn) -> Response:
    queue = _queue(request, conn, name)
    counts = queue["counts"]
    doomed = counts["pending"] + counts["scheduled"] + counts["dead"]
    return render(request, who, "purge.html", queue=queue, doomed=doomed)


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
def vacuum_confirmation(request: Request, name: str, who: Page, conn: Conn, older_than: str = "7d") -> Response:
    queue = _queue(request, conn, name)
    age, seconds = _vacuum_age(older_than)
    doomed = admin.count_vacuum_dead(conn, name, seconds)
    return render(
        request,
        who,
        "vacuum.html",
        queue=queue,
        doomed=doomed,
        age=age,
        what=_vacuumed(age, doomed),
        ages={value: option for value, (option, _) in VACUUM_AGES.items()},
    )


@router.post("/queues/{name}/vacuum-dead")
def vacuum_dead(request: Request, name: str, fields: Fields, who: Action, conn: Conn) -> Response:
    _queue(request, conn, name)
    age, seconds = _vacuum_age(fields.get("older_than", ""))
    deleted = admin.vacuum_dead(conn, name, seconds)
    return redirect(who, PREFIX + "/queues", f"Vacuumed queue {name}: deleted {_vacuumed(age, deleted)}.")


@router.post("/queues/{name}/{action}")
def act_on_queue(request: Request, name: str, action: str, who: Action, conn: Conn) -> Response:
    _queue(request, conn, name)
    back = PREFIX + "/queues"
    if action == "pause":
        admin.pause_queue(conn, name)
        return redirect(who, back, f"Queue {name} paused: workers stop claiming its jobs.")
    if action == "resume":
        admin.resume_queue(conn, name)
        return redirect(who, back, f"Queue {name} resumed.")
    if action == "retry-dead":
        retried = admin.retry_dead(conn, name)
        return redirect(who, back, f"Retried {retried} dead job{'s' * (retried != 1)} of queue {name}.")
    if action == "purge":
        report = admin.purge_queue(conn, name)
        return redirect(
            who,
            back,
            f"Purged queue {name}: deleted {report['pending']} pending, "
            f"{report['scheduled']} scheduled and {report['dead']} dead jobs; "
            f"{report['active_left']} active and {report['paused_left']} paused left alone.",
        )
    return redirect(who, back, f"Unknown action {action!r}.", "error")


# --- schedules ----------------------------------------------------------------------------------------


@router.get("/schedules")
def schedules_page(request: Request, who: Page, conn: Conn) -> Response:
    return render(request, who, "schedules.html", schedules=schedules.list_schedules(conn))


@router.post("/schedules/{name}/{action}")
def act_on_schedule(name: str, action: str, who: Action, conn: Conn) -> Response:
    back = PREFIX + "/schedules"
    try:
        if action == "pause":
            schedules.pause(conn, name)
            return redirect(who, back, f"Schedule {name} paused.")
        if action == "resume":
            schedules.resume(conn, name)
            return redirect(who, back, f"Schedule {name} resumed from its next occurrence.")
        if action == "trigger":
            job, _ = schedules.trigger(conn, name)
            return redirect(who, back, f"Schedule {name} triggered: job {job.id} enqueued.")
    except (NotFound, Conflict, EnqueueError) as exc:
        return redirect(who, back, f"Schedule {name}: {exc}", "error")
    return redirect(who, back, f"Unknown action {action!r}.", "error")


# --- wiring ---------------------------------------------------------------------------------------------


def install_dashboard(app: FastAPI) -> None:
    tokens = app.state.settings.api_tokens
    app.state.dashboard_tokens = Tokens(tokens)
    app.state.dashboard_signer = Signer(secret_key(tokens))
    settings = app.state.settings
    app.state.auth_throttle = AuthThrottle(
        app.state,
        settings.failed_token_limit,  # shared with app.auth.BearerAuth
        settings.failed_token_window,
    )
    app.mount(PREFIX + "/static", StaticFiles(directory=str(TEMPLATES / "static")), name="dashboard-static")
    app.include_router(router)

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse(PREFIX + "/", status_code=307)

    # Browsers ask for /favicon.ico on a first visit whatever the page links: a 404 there was a console
    # error on every new browser. The same icon as the pages' <link rel=icon>, SVG (every current browser).
    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return FileResponse(
            TEMPLATES / "static" / "favicon.svg",
            media_type="image/svg+xml",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, _: LoginRequired) -> Response:
        target = request.url.path + ("?" + request.url.query if request.url.query else "")
        return RedirectResponse(f"{PREFIX}/login?" + urlencode({"next": target}), status_code=303)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return error_page(request, exc.status, exc.title, exc.message)


def is_dashboard(request: Request) -> bool:
    return request.url.path == PREFIX or request.url.path.startswith(PREFIX + "/")
