"""The two enqueue routes' well-formed requests, answered without FastAPI's request machinery.

`POST /api/v1/jobs` and `POST /api/v1/jobs/batch` are the API's hot paths (issue 12: HTTP enqueue
within 80% of a bare FastAPI endpoint). On a request that reached them, FastAPI's routing, its
`Request` and dependency solving, and the exception middleware's wrapping cost about as much
server CPU as dygo's own work. This pure ASGI middleware, the innermost (after the perimeter,
auth and the body limit), answers a well-formed request itself with the routes' own code
(app/jobs.py: `enqueue_one`, `enqueue_many`): the body is parsed with `json.loads` and validated
with the same request models in Python mode, as FastAPI does.

Everything else goes to FastAPI unchanged, with the body replayed: a content type other than
`application/json`, a body that is not JSON or that the models refuse, an Idempotency-Key header
that is not one of 1 to 255 characters, and every request while tracing is on (FastAPI's request
telemetry then sees the route). So each refusal of the request model is FastAPI's own 400 or 422,
and the OpenAPI document stays the routes'. What the routes' code raises (a 409, a 422 of the
store, a 503) is answered by the app's exception handlers, as ExceptionMiddleware would.

A batch entry that is plain (`kind` and `args` only, a kind with no args model) skips the
ten-field model: for such an entry the model would only check what is checked here (a string kind,
an object of args) and set every option to its default.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from dygo.app.body_limit import replay
from dygo.app.jobs import enqueue_many, enqueue_one
from dygo.app.schemas import EnqueueRequest
from dygo.store import tracing
from dygo.store.enqueue import JobRequest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

ONE = "/api/v1/jobs"
BATCH = "/api/v1/jobs/batch"
JSON_TYPE = b"application/json"
IDEMPOTENCY_HEADER = b"idempotency-key"
PLAIN_KEYS = frozenset({"kind", "args"})


class _Refused(Exception):
    """The request is not one this path answers: FastAPI's route does (and names what is wrong)."""


class FastEnqueue:
    """Pure ASGI middleware: well-formed enqueue requests answered by the routes' code directly."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if (path != ONE and path != BATCH) or scope["type"] != "http" or scope["method"] != "POST" or tracing.active():
            await self.app(scope, receive, send)
            return
        content_type = None
        idempotency: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value if content_type is None else b""
            elif name == IDEMPOTENCY_HEADER:
                idempotency.append(value)
        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        state = scope["app"].state
        try:
            if content_type != JSON_TYPE or len(idempotency) > 1:
                raise _Refused
            data = json.loads(body)
            if path == ONE:
                header = idempotency[0].decode("latin-1") if idempotency else None
                if header is not None and not 1 <= len(header) <= 255:
                    raise _Refused
                answer = enqueue_one(state, EnqueueRequest.model_validate(data), header)
            else:
                answer = enqueue_many(state, _batch_entries(data, state.jobs))
        except (_Refused, ValueError, RecursionError):  # not JSON (JSONDecodeError, too deep), or ValidationError
            await self.app(scope, replay(body, receive), send)
            return
        try:
            response = await answer
        except Exception as exc:
            handler = _handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            request = Request(scope, replay(body, receive))
            if inspect.iscoroutinefunction(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
        await response(scope, receive, send)


def _batch_entries(data: Any, jobs: Any) -> list[EnqueueRequest | JobRequest]:
    """The entries of a batch body: a JobRequest for each plain entry, the request model for the others;
    _Refused (or ValidationError) for a body the batch model would refuse."""
    if type(data) is not dict or data.keys() != {"jobs"} or type(data["jobs"]) is not list:
        raise _Refused
    entries: list[EnqueueRequest | JobRequest] = []
    for entry in data["jobs"]:
        if type(entry) is dict and entry.keys() <= PLAIN_KEYS:
            kind = entry.get("kind")
            args = entry.get("args", {})
            definition = jobs.get(kind) if type(kind) is str else None
            if type(kind) is str and type(args) is dict and (definition is None or definition.args_model is None):
                entries.append(JobRequest(kind, args))
                continue
        entries.append(EnqueueRequest.model_validate(entry))
    return entries


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole body (BodyLimit has bounded it), and whether the client went away meanwhile."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks), False


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The app's handler for `exc` as Starlette's ExceptionMiddleware picks it (the nearest class in its MRO);
    None for one it leaves to ServerErrorMiddleware (a handler of Exception or 500: the unexpected)."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
