"""What `dygo serve` does about slow and numerous clients, below the app: uvicorn's HTTP/1.1 protocol (h11)
with time limits on receiving a request and a cap on open connections.

uvicorn times out only an idle keep-alive connection: a request whose headers or body never finish would
hold its connection, and its file descriptor, for ever, and enough of them stop the service accepting
anything. So here:

* **Headers** must all arrive within `serve_header_timeout` of the connection opening (or of the previous
  response, on a kept-alive connection).
* **A body** must all arrive within `serve_body_timeout` of its headers.
* **Connections** are capped at `serve_max_connections`, and below the process's file-descriptor limit.
  When full, the connection that has waited longest for a request's headers is closed to make room (a
  slow client, or an idle keep-alive one); when none is waiting, the new connection is closed.
* **Accept failures** (out of file descriptors all the same, from elsewhere) are logged once per interval
  with a count, where asyncio logs a traceback per failed accept, thousands a second.

Timed-out and evicted connections are closed without a log line: a client choosing to be slow should not
choose how much is logged either. A request that turns malformed after it was answered (a bad chunk after an
early 401) is closed with uvicorn's one warning line, not a traceback. A request with both Content-Length and
Transfer-Encoding gets its connection closed after the answer.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Iterable
from typing import Any

import h11
from dygo.store.config import Settings
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("dygo.serve")

PROTOCOL = "dygo.app.connections:SlowClientGuard"  # for uvicorn's `http=`, in every web process
FILES_KEPT = 128  # file descriptors left for everything but client connections (database, logs, listener)
MAX_BACKLOG = 2048  # uvicorn's
ACCEPT_LOG_INTERVAL = 10.0  # seconds between two lines about failed accepts or a full connection table
ACCEPT_FAILURE = "socket.accept() out of system resource"
CLOSE = (b"connection", b"close")


def capacity(wanted: int) -> tuple[int, int]:
    """(connection cap, listen backlog) that fit the process's file-descriptor limit. The event loop accepts
    up to a backlog of connections at a time before the cap can close any, a few times over while closes
    are pending, so the cap leaves room for four backlogs; `wanted` is the cap asked for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted, MAX_BACKLOG
    backlog = min(MAX_BACKLOG, max(16, (soft - FILES_KEPT) // 8))
    return max(1, min(wanted, soft - FILES_KEPT - 4 * backlog)), backlog


def configure(settings: Settings) -> tuple[int, int]:
    """Applies the settings to the connections of this process; returns (connection cap, listen backlog)."""
    SlowClientGuard.header_timeout = settings.serve_header_timeout
    SlowClientGuard.body_timeout = settings.serve_body_timeout
    cap, backlog = capacity(settings.serve_max_connections)
    SlowClientGuard.max_connections = cap
    return cap, backlog


class EveryInterval:
    """A warning logged at most once per interval, with how many times it happened meanwhile."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = -interval
        self.count = 0

    def warn(self, message: str, *args: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.interval:
            log.warning(message + " (%d times in the last %gs)", *args, self.count, self.interval)
            self.last, self.count = now, 0


class SlowClientGuard(H11Protocol):
    header_timeout = 10.0
    body_timeout = 30.0
    max_connections = 1000
    # Connections waiting for a request's headers, oldest first (one server per process).
    waiting: dict[SlowClientGuard, None] = {}
    full = EveryInterval(ACCEPT_LOG_INTERVAL)
    accept_failures = EveryInterval(ACCEPT_LOG_INTERVAL)
    guarded_loop: asyncio.AbstractEventLoop | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.awaiting: str | None = None  # "headers", "body" or None
        self.refused = False
        self.framed: object = None  # the request cycle whose framing was checked

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if SlowClientGuard.guarded_loop is not self.loop:
            SlowClientGuard.guarded_loop = self.loop
            self.loop.set_exception_handler(_quiet_accept_failures)
        if len(self.connections) >= self.max_connections:
            oldest = next(iter(self.waiting), None)
            self.full.warn(
                "connections: %d open, the most allowed (serve_max_connections): closing the one waiting "
                "longest for a request, or else the new one",
                len(self.connections),
            )
            if oldest is None:
                self.refused = True
                transport.close()
                return
            oldest.close()
        super().connection_made(transport)
        self.watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.waiting.pop(self, None)
        self.stop_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.watch()

    def send_400_response(self, msg: str) -> None:
        """The answer to a request h11 cannot parse, after uvicorn's one warning line. When the answer to this
        request is already out (an early 401 or 403, then a malformed chunk), a 400 can no longer be sent:
        the connection is closed, where uvicorn's attempt raised from the parser with a traceback."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            super().send_400_response(msg)
        else:
            self.transport.close()

    def watch(self) -> None:
        """Checks a new request's framing, and arms the deadline for what the connection now waits for from
        the client."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle is not self.framed:
            self.framed = self.cycle
            self.close_if_ambiguous(self.cycle.scope["headers"])
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.awaiting != "headers":
                self.waiting[self] = None
                self.start_deadline("headers", self.header_timeout)
        elif state is h11.SEND_BODY:
            self.waiting.pop(self, None)
            if self.awaiting != "body":
                self.start_deadline("body", self.body_timeout)
        else:  # the request is all in (or the connection is done with)
            self.waiting.pop(self, None)
            self.stop_deadline()

    def close_if_ambiguous(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """A request with both Content-Length and Transfer-Encoding (h11 goes by Transfer-Encoding) may be read
        otherwise by a proxy in front: the bytes after it could be a request smuggled past that proxy. So it
        is answered with `Connection: close`, and the connection closed (RFC 9112, 6.3)."""
        names = {name for name, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            self.cycle.keep_alive = False
            self.cycle.default_headers = [*self.cycle.default_headers, CLOSE]

    def start_deadline(self, awaiting: str, seconds: float) -> None:
        self.stop_deadline()
        self.awaiting = awaiting
        self.deadline = self.loop.call_later(seconds, self.close)

    def stop_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline, self.awaiting = None, None

    def close(self) -> None:
        """Closes the connection: a request that did not arrive in time, or room made for a new one. An app
        still reading the body gets `http.disconnect`."""
        self.waiting.pop(self, None)
        self.stop_deadline()
        if not self.transport.is_closing():
            self.transport.close()


def _quiet_accept_failures(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if context.get("message") == ACCEPT_FAILURE:
        SlowClientGuard.accept_failures.warn(
            "cannot accept connections: %s; raise the file-descriptor limit (ulimit -n) or lower serve_max_connections",
            context.get("exception"),
        )
        return
    loop.default_exception_handler(context)
