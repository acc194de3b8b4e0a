"""The perimeter of `dygo serve`, in front of everything else (auth included), in every mode.

* **Host**: only Host values the service is bound to are answered (plus `allowed_hosts`), so a page
  whose name was rebound to this machine's address (DNS rebinding) cannot read anything. An IP
  literal cannot be rebound: bound to every interface (0.0.0.0, ::) any address is answered.
* **Origin**: a request that may change something (any method but GET, HEAD and OPTIONS) is refused
  when the browser says it comes from another site (`Sec-Fetch-Site`) or another origin (`Origin`).
  Clients that are not browsers send neither and are let through (auth still applies).
* **Headers** on every response: no framing, no MIME sniffing, same-origin referrers, a
  Content-Security-Policy (strict on the dashboard), and `Cache-Control: no-store` on everything
  that needs a token or a session.
* **Redirects** built by Starlette from the Host header (trailing slashes) are made relative.
* **Client protocol errors** (a malformed chunked body after the answer was sent): uvicorn's one
  warning line, not a traceback per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from dygo.app.errors import error_response
from dygo.app.paths import route_path
from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("dygo.serve")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of a request the service's own pages (or a person typing a URL) made.
OWN_SITE = frozenset({"same-origin", "none"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
LOCAL_NAMES = frozenset({"localhost"})

FRAMING = "frame-ancestors 'none'"
# The dashboard: its own script and stylesheet files only; `style` attributes (chart positions) allowed.
DASHBOARD_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; " + FRAMING
)
# /docs and /redoc: their pinned bundles from this origin (and the inline start-up script FastAPI writes).
DOCS_POLICY = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; worker-src 'self' blob:; "
    "form-action 'self'; base-uri 'none'; " + FRAMING
)
DEFAULT_POLICY = "default-src 'none'; " + FRAMING
DOCS_PATHS = ("/docs", "/redoc")
PRIVATE_PREFIXES = ("/api/", "/metrics", "/dashboard")
PUBLIC_PREFIXES = ("/dashboard/static/",)
REDIRECTS = frozenset({301, 302, 303, 307, 308})
DISCONNECT_WAIT = 1.0  # seconds
VERDICTS_KEPT = 256  # distinct Host headers whose verdict is remembered


def split_host(header: str) -> tuple[str, int | None] | None:
    """(host, port) of a Host header or an authority, or None when it is not one: `name`, `name:80`,
    `1.2.3.4`, `[::1]:8000`. The host is lowercased, without a trailing dot or the IPv6 brackets."""
    header = header.strip()
    if header.startswith("["):
        host, bracket, rest = header[1:].partition("]")
        if not bracket:
            return None
    else:
        host, _, port_text = header.partition(":")
        rest = ":" + port_text if _ else ""
    if rest and (not rest.startswith(":") or not rest[1:].isdigit() or int(rest[1:]) > 65535):
        return None
    host = host.lower().rstrip(".")
    if not host or any(c in host for c in "/\\@ ?#"):
        return None
    return host, int(rest[1:]) if rest else None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class HostRule:
    """Which Host values the service answers: those it is bound to, and the allow-list."""

    def __init__(self, bound: str, allowed: Iterable[str]) -> None:
        self.bound = bound.strip("[]").lower()
        self.allowed = tuple(rule.lower().rstrip(".") for rule in allowed)
        ip = _ip(self.bound)
        self.wildcard = self.bound in WILDCARDS
        self.loopback = self.bound in LOCAL_NAMES or (ip is not None and ip.is_loopback)

    def admits(self, host: str) -> bool:
        for rule in self.allowed:
            if rule == "*" or host == rule or (rule.startswith(".") and (host == rule[1:] or host.endswith(rule))):
                return True
        if host == self.bound:
            return True
        ip = _ip(host)
        if self.wildcard:
            return ip is not None or host in LOCAL_NAMES
        if self.loopback:
            return host in LOCAL_NAMES or (ip is not None and ip.is_loopback)
        return False

    def describe(self) -> str:
        """For the start-up line: what this service answers."""
        if self.wildcard:
            own = "any IP address, localhost"
        elif self.loopback:
            own = "localhost, loopback addresses"
        else:
            own = self.bound
        return f"{own}; allowed hosts: {', '.join(self.allowed) if self.allowed else 'none'}"


def _same_origin(origin: str, host: str, port: int | None) -> bool:
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    theirs = split_host(parts.netloc)
    if theirs is None or theirs[0] != host:
        return False
    if port is None:  # no port in Host (a proxy on 80/443): the name decides
        return True
    return (theirs[1] or (443 if parts.scheme == "https" else 80)) == port


def _policy(path: str) -> str:
    if path == "/dashboard" or path.startswith("/dashboard/"):
        return DASHBOARD_POLICY
    if path in DOCS_PATHS or path.startswith("/docs/"):
        return DOCS_POLICY
    return DEFAULT_POLICY


def _private(path: str) -> bool:
    return path.startswith(PRIVATE_PREFIXES) and not path.startswith(PUBLIC_PREFIXES)


class Perimeter:
    """Pure ASGI middleware: the Host and Origin checks, the security headers, relative redirects."""

    def __init__(self, app: ASGIApp, hosts: HostRule) -> None:
        self.app, self.hosts = app, hosts
        # Host header -> (its host and port, refused?): clients send a handful of values, each parsed once.
        self._verdicts: dict[str, tuple[tuple[str, int | None] | None, bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        headers = dict(scope["headers"])
        host_header = headers.get(b"host", b"").decode("latin-1")
        secured = self._secured(send, path, host_header)
        refusal = self._refusal(scope, headers, host_header)
        try:
            if refusal is not None:
                await refusal(scope, receive, secured)
            else:
                await self.app(scope, receive, secured)
        except Exception as exc:
            if not _client_broke_protocol(exc):
                raise
            # uvicorn has already logged "Invalid HTTP request received." and answered 400, and is closing
            # the connection: wait for it to say so (http.disconnect), or it logs our unfinished answer too.
            log.debug("client protocol error on %s %s: %s", scope["method"], path, exc)
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(receive(), DISCONNECT_WAIT)

    def _verdict(self, host_header: str) -> tuple[tuple[str, int | None] | None, bool]:
        verdict = self._verdicts.get(host_header)
        if verdict is None:
            host = split_host(host_header) if host_header else None
            verdict = host, bool(host_header) and (host is None or not self.hosts.admits(host[0]))
            if len(self._verdicts) >= VERDICTS_KEPT:  # a client making up Host values only empties it
                self._verdicts.clear()
            self._verdicts[host_header] = verdict
        return verdict

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes], host_header: str) -> JSONResponse | None:
        host, refused = self._verdict(host_header)
        if refused:
            shown = host_header[:100].encode("ascii", "backslashreplace").decode()
            return error_response(
                400,
                "host_not_allowed",
                f"this service does not answer to the Host {shown!r}; add the name to "
                "allowed_hosts in config/dygo.yml or DYGO_ALLOWED_HOSTS",
                {"host": shown},
            )
        if scope["method"] in SAFE_METHODS:
            return None
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        origin = headers.get(b"origin", b"").decode("latin-1")
        cross = bool(site) and site not in OWN_SITE
        if not cross and origin:
            cross = host is None or not _same_origin(origin, *host)
        if not cross:
            return None
        shown = (origin or "another site")[:100].encode("ascii", "backslashreplace").decode()
        return error_response(
            403,
            "cross_site_request",
            f"a {scope['method']} from {shown} was refused: a page of another site may not "
            "change anything here (Origin / Sec-Fetch-Site). Use the dashboard itself, or "
            "call the API from a program (no browser)",
            {"origin": origin[:100] or None, "sec_fetch_site": site or None},
        )

    def _secured(self, send: Send, path: str, host_header: str) -> Send:
        added = _SECURITY_HEADERS[(_policy(path), _private(path))]

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                # One pass over the raw headers, where MutableHeaders would scan them once per header set.
                raw = list(message.get("headers", ()))
                present = {name.lower() for name, _ in raw}
                if (b"cache-control", b"no-store") in added and b"cache-control" in present:
                    raw = [(name, value) for name, value in raw if name.lower() != b"cache-control"]
                    present.discard(b"cache-control")
                raw.extend((name, value) for name, value in added if name not in present)
                message["headers"] = raw
                if message["status"] in REDIRECTS and b"location" in present:
                    headers = MutableHeaders(scope=message)
                    headers["location"] = _relative(headers["location"], host_header)
            await send(message)

        return secured


def _security_headers(policy: str, private: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The headers every response gets (each unless the app set it), and `Cache-Control: no-store` (always, in
    place of the app's) on what needs a token or a session."""
    headers = [
        (b"x-frame-options", b"DENY"),
        (b"content-security-policy", policy.encode("latin-1")),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    ]
    if private:
        headers.append((b"cache-control", b"no-store"))
    return tuple(headers)


_SECURITY_HEADERS = {
    (policy, private): _security_headers(policy, private)
    for policy in (DASHBOARD_POLICY, DOCS_POLICY, DEFAULT_POLICY)
    for private in (False, True)
}


def _relative(location: str, host_header: str) -> str:
    """An absolute URL to this service (as the Host header named it) as a path: never a redirect to a Host."""
    parts = urlsplit(location)
    if parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.lower():
        path = parts.path or "/"
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        return path + ("?" + parts.query if parts.query else "")
    return location


def _client_broke_protocol(exc: BaseException) -> bool:
    """An error from the HTTP parser about what the client sent (h11's LocalProtocolError when the answer
    cannot be sent on a connection the client's malformed body has already ended)."""
    return type(exc).__module__.split(".")[0] in ("h11", "httptools")
