"""Bearer tokens for the API, and the rule for when `dygo serve` may run without them.

Every path under /api/, and /metrics, needs a token once any token is configured: a `read` token for GET and
HEAD, an `admin` token for everything else. The check is middleware rather than a per-route
dependency, so a route added later is protected without anyone remembering to, and an
unauthenticated request is refused before its body is read. /healthz, /readyz and the OpenAPI
documents stay open (load balancers and browsers reach them without a token).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import error_response
from store.config import TOKEN_ENV, Settings
from store.errors import ConfigError

PROTECTED_PREFIX = "/api/"
# Prometheus metrics name queues, kinds and worker hosts: a read token is needed, like /api/ GETs
# (Prometheus sends it with `authorization: {credentials: ...}` in the scrape config).
PROTECTED_PATHS = frozenset({"/metrics"})
READ_METHODS = frozenset({"GET", "HEAD"})


class Tokens:
    """The configured tokens, kept only as SHA-256 digests and compared in constant time."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._digests = [(role, _digest(token)) for role, token in pairs]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def role_of(self, presented: str) -> str | None:
        """The strongest role the token grants, or None. Every configured token is compared, match
        or not, and digests have one length, so the time taken says nothing about the tokens."""
        digest = _digest(presented)
        role = None
        for candidate, expected in self._digests:
            if hmac.compare_digest(digest, expected) and role != "admin":
                role = candidate
        return role


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def _protected(path: str) -> bool:
    return path.startswith(PROTECTED_PREFIX) or path in PROTECTED_PATHS


class BearerAuth:
    """Pure ASGI middleware enforcing the roles; a no-op when no token is configured."""

    def __init__(self, app: ASGIApp, tokens: Tokens) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens.enabled or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope):
        challenge = {"WWW-Authenticate": 'Bearer realm="dygo"'}
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error_response(401, "unauthorized", "this API needs a bearer token: Authorization: Bearer <token>",
                                  headers=challenge)
        role = self.tokens.role_of(token.strip())
        if role is None:
            return error_response(401, "unauthorized", "the bearer token is not valid", headers=challenge)
        if role != "admin" and scope["method"] not in READ_METHODS:
            return error_response(403, "forbidden", "this token is read-only; this operation needs an admin token")
        return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_protection(settings: Settings, host: str | None) -> None:
    """Refuse to serve an unprotected API anywhere but development on localhost.

    Tokens are required when the environment is not development, or when the server binds to
    anything but a loopback address. `host=None` checks the environment only.
    """
    if settings.api_tokens:
        return
    how = f"set {TOKEN_ENV['admin']} (and {TOKEN_ENV['read']} for read-only access), or api_tokens in dygo.yml"
    if settings.env != "development":
        raise ConfigError("dygo serve", f"environment {settings.env}",
                          f"the API must be protected outside development: {how}")
    if host is not None and not is_loopback(host):
        raise ConfigError("dygo serve", f"host {host}",
                          f"binding beyond localhost exposes the API, so it must be protected: {how}")
