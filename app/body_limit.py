"""Refuse request bodies above max_payload_bytes with 413, before anything parses them."""

from __future__ import annotations

from dygo.app.errors import error_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """Pure ASGI: checks Content-Length first, then counts the streamed bytes (chunked uploads).

    The body is read here in full (it is at most the limit) and replayed to the app, so a body
    that turns out too large midway is refused before any endpoint has seen a byte of it.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "payload_too_large",
            f"the request body is larger than {self.max_bytes} bytes (max_payload_bytes)",
            {"max_bytes": self.max_bytes},
        )
        await response(scope, receive, send)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app `body`, already read whole, as one message, then whatever `receive`
    gives (a disconnect)."""
    replayed = False

    async def replayed_receive() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed_receive
