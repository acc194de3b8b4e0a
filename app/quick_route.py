"""A FastAPI route whose well-formed requests skip FastAPI's request machinery.

The enqueue routes are the API's hot paths, and on them FastAPI's dependency solving (reading the
body and each parameter into the endpoint's arguments) is a large part of each request's cost.
A QuickRoute is one route in the app's route table, documented by FastAPI from its endpoint
like any other. Its `quick` handler does that dependency solving for the request every client
sends (a JSON body the endpoint's model takes, well-formed headers) and calls the endpoint with the
result; it declines (None) anything else, which FastAPI's standard handling of the same endpoint
answers, naming what is wrong. Both run inside the route, under the app's exception handlers, so
an error the endpoint raises is answered the same way on either path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

Body = TypeVar("Body")
QuickHandler = Callable[[Request], Awaitable[Response | None]]

# The one content type the quick handlers read; FastAPI's standard handling reads every JSON type.
JSON_TYPE = "application/json"


def quick_route(quick: QuickHandler) -> type[APIRoute]:
    """A route class (for `add_api_route(route_class_override=...)`) whose requests `quick` answers
    first; FastAPI's standard handling answers those it declines."""

    class QuickRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            standard = super().get_route_handler()

            async def handle(request: Request) -> Response:
                # The body a declined request's standard handling reads is the one Request already read.
                response = await quick(request)
                return response if response is not None else await standard(request)

            return handle

    return QuickRoute


async def quick_body(request: Request, body: TypeAdapter[Body]) -> Body | None:
    """The request's body as `body` validates it, when it is sent as `application/json` and valid; None
    otherwise (FastAPI's standard handling then reads it, or names what is wrong). Pydantic reads the JSON
    text itself (its JSON mode: no Python objects in between), to the values FastAPI's parse-then-validate
    gives; text its parser refuses and Python's takes (a lone surrogate) is declined."""
    if request.headers.get("content-type") != JSON_TYPE:
        return None
    try:
        return body.validate_json(await request.body())
    except ValidationError:
        return None
