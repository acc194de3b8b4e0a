"""Bearer tokens for the API, and the rule for when `dygo serve` may run without them.

Every path under /api/, and /metrics, needs a token once any token is configured: a `read` token for GET and
HEAD, an `admin` token for everything else. The check is middleware rather than a per-route
dependency, so a route added later is protected without anyone remembering to, and an
unauthenticated request is refused before its body is read. /healthz, /readyz and the OpenAPI
documents stay open (load balancers and browsers reach them without a token), and so do events' callback
URLs, whose route checks the signature they carry instead (app/events.py).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import re
import time
from collections.abc import Iterable

import psycopg
from dygo.app.db import down, unavailable_response
from dygo.app.errors import error_response
from dygo.app.paths import route_path
from dygo.app.session import SECRET_ENV
from dygo.app.throttle import AuthThrottle
from dygo.store.config import TOKEN_ENV, Settings
from dygo.store.errors import ConfigError, DatabaseUnavailable
from dygo.store.outage import is_outage
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

PROTECTED_PREFIX = "/api/"
# Prometheus metrics name queues, kinds and worker hosts: a read token is needed, like /api/ GETs
# (Prometheus sends it with `authorization: {credentials: ...}` in the scrape config).
PROTECTED_PATHS = frozenset({"/metrics"})
READ_METHODS = frozenset({"GET", "HEAD"})


class Tokens:
    """The configured tokens, kept only as SHA-256 digests and compared in constant time."""

    def __init__(self, pairs: Iterable[tuple[str, str]], key: bytes = b"") -> None:
        self._digests = [(role, _digest(token)) for role, token in pairs]
        # A dashboard session remembers which token signed it in by this fingerprint (never the token):
        # once that token is no longer configured, the session is over (a rotation signs it out). The
        # fingerprint is an HMAC under `key` (the dashboard's signing key): the cookie is readable, and an
        # unkeyed hash there would let whoever copied it test token guesses offline.
        self._key = key
        self._fingerprints: dict[str, str] = {}
        for role, digest in self._digests:
            if self._fingerprints.get(_fingerprint(key, digest)) != "admin":
                self._fingerprints[_fingerprint(key, digest)] = role

    def fingerprint(self, presented: str) -> str:
        return _fingerprint(self._key, _digest(presented))

    def role_of_fingerprint(self, fingerprint: str | None) -> str | None:
        return self._fingerprints.get(fingerprint or "")

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


def _fingerprint(key: bytes, digest: bytes) -> str:
    return hmac.new(key, b"dygo-session-token\n" + digest, hashlib.sha256).hexdigest()[:32]


# A callback URL's path (app/events.py): its signature is its credential, checked by the route, so a third
# party can call it with no token.
SIGNED_PATHS = re.compile(r"^/api/v1/events/[^/]+/callback$")


def signed(path: str) -> bool:
    return SIGNED_PATHS.match(path) is not None


def _protected(path: str) -> bool:
    return (path.startswith(PROTECTED_PREFIX) and not signed(path)) or path in PROTECTED_PATHS


class BearerAuth:
    """Pure ASGI middleware enforcing the roles; a no-op when no token is configured.

    Wrong bearer tokens count against the client's address in the shared throttle (app/throttle.py):
    after failed_token_limit within failed_token_window the address gets 429 until the oldest of them is that old,
    even with the right token. A right token is read in the throttle's table only when its address has
    failures on record (or notifications cannot be relied on: app/throttle.py).
    """

    def __init__(self, app: ASGIApp, tokens: Tokens) -> None:
        self.app, self.tokens = app, tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens.enabled or not _protected(route_path(scope)):
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    async def _refusal(self, scope: Scope) -> Response | None:
        challenge = {"WWW-Authenticate": 'Bearer realm="dygo"'}
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error_response(
                401, "unauthorized", "this API needs a bearer token: Authorization: Bearer <token>", headers=challenge
            )
        role = self.tokens.role_of(token.strip())
        state = scope["app"].state
        throttle: AuthThrottle = state.auth_throttle
        address = scope["client"][0] if scope.get("client") else "unknown"
        try:
            until = await (throttle.failed(address) if role is None else throttle.admit(address))
        except DatabaseUnavailable as exc:
            return unavailable_response(exc)
        except psycopg.Error as exc:
            if not is_outage(exc):
                raise  # not an outage: the server's 500 handler logs it
            state.outage.lost(f"{scope['method']} {scope['path']} (token throttle)", exc)
            return unavailable_response(down(exc))
        if until is not None:
            return locked_out(until, throttle)
        if role is None:
            return error_response(401, "unauthorized", "the bearer token is not valid", headers=challenge)
        if role != "admin" and scope["method"] not in READ_METHODS:
            return error_response(403, "forbidden", "this token is read-only; this operation needs an admin token")
        return None


def locked_out(until: float, throttle: AuthThrottle) -> JSONResponse:
    wait = max(1, math.ceil(until - time.time()))
    return error_response(
        429,
        "too_many_failures",
        f"too many wrong tokens within {throttle.window:g}s, from your address ({throttle.attempts}) or from "
        f"all addresses together ({throttle.global_attempts}): tokens from it are refused for {wait}s (the right "
        "one too); check the token you send",
        {"retry_after_seconds": wait},
        headers={"Retry-After": str(wait)},
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Token strength (production refuses weaker): what a generated token has, at least MIN_TOKEN_LENGTH
# characters and an estimate of MIN_TOKEN_BITS bits an attacker must guess, after taking out what makes a
# token guessable: a character repeating the one before, a run (abc, 1234, each next character one up or
# down), a common word (counted as one character), and a substring seen earlier in the token (abcabc).
# secrets.token_urlsafe(32) (43 characters) and token_hex(32) always pass, token_hex(16) nearly always (its
# few symbols make runs common); a name or a phrase a person picks does not.
MIN_TOKEN_LENGTH = 32
MIN_TOKEN_BITS = 100
GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
COMMON_WORDS = (
    "password",
    "passw0rd",
    "p@ssword",
    "qwerty",
    "azerty",
    "letmein",
    "welcome",
    "changeme",
    "default",
    "iloveyou",
    "monkey",
    "dragon",
    "master",
    "secret",
    "admin",
    "token",
    "login",
    "dygo",
    "test",
)
_WORDS = re.compile("|".join(sorted(COMMON_WORDS, key=len, reverse=True)), re.IGNORECASE)


def token_bits(token: str) -> float:
    """A rough strength estimate of a token, in bits (see MIN_TOKEN_BITS)."""
    classes = [(str.islower, 26), (str.isupper, 26), (str.isdigit, 10)]
    pool = sum(size for test, size in classes if any(test(c) for c in token))
    pool += 33 if any(not c.isalnum() for c in token) else 0
    text = _WORDS.sub("\x00", token)  # a word: one symbol
    effective = 0
    index = 0
    while index < len(text):
        # The longest earlier substring (4+ characters) starting here counts as one symbol.
        length = 0
        for size in range(min(16, len(text) - index), 3, -1):
            if text[index : index + size] in text[:index]:
                length = size
                break
        if length:
            effective += 1
            index += length
            continue
        c = text[index]
        before = text[index - 1] if index else None
        if before is None or c == "\x00" or (c != before and abs(ord(c) - ord(before)) != 1):
            effective += 1
        index += 1
    return effective * math.log2(max(pool, 2))


def weak_token(token: str) -> bool:
    return len(token) < MIN_TOKEN_LENGTH or token_bits(token) < MIN_TOKEN_BITS


def _too_simple(what: str, token: str) -> str:
    """Why `token` is refused, without the token itself."""
    return (
        f"{what} is too short or too simple to be random ({len(token)} characters, about {token_bits(token):.0f} "
        f"bits; production needs {MIN_TOKEN_LENGTH} characters and {MIN_TOKEN_BITS} bits: no words or phrases, "
        f"no repeated or running characters like aaaa or 1234); generate one with {GENERATE}"
    )


def check_protection(settings: Settings, host: str | None) -> None:
    """Refuse to serve an unprotected API anywhere but development on localhost, or weak tokens in production.

    Tokens are required when the environment is not development, or when the server binds to
    anything but a loopback address. `host=None` checks the environment only.
    """
    if settings.env == "production":
        for role, token in settings.api_tokens:
            if weak_token(token):  # the token itself is never put in a message
                where = f"a token (from {TOKEN_ENV[role]} or api_tokens in dygo.yml)"
                raise ConfigError("dygo serve", f"{role} token", _too_simple(where, token))
        secret = os.environ.get(SECRET_ENV)
        if secret and weak_token(secret):
            raise ConfigError(
                "dygo serve", SECRET_ENV, _too_simple(f"the dashboard's signing key ({SECRET_ENV})", secret)
            )
    if settings.api_tokens:
        return
    how = f"set {TOKEN_ENV['admin']} (and {TOKEN_ENV['read']} for read-only access), or api_tokens in dygo.yml"
    if settings.env != "development":
        raise ConfigError(
            "dygo serve", f"environment {settings.env}", f"the API must be protected outside development: {how}"
        )
    if host is not None and not is_loopback(host):
        raise ConfigError(
            "dygo serve", f"host {host}", f"binding beyond localhost exposes the API, so it must be protected: {how}"
        )
