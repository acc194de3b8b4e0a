"""The dashboard's login session: a signed cookie, its CSRF token, and one-shot flash messages.

The cookie holds `{"sid", "role", "exp", "tk"}` as JSON signed by itsdangerous (HMAC-SHA256). The key
is DYGO_SECRET_KEY, or derived from the configured tokens (rotating the tokens then ends every
session), or random per process in development without tokens. A signed-in session also counts only
while its row is in dygo_dashboard_sessions (signing out deletes it, on every process at once) and
while the token it was signed in with (`tk`, a fingerprint of it keyed by the same key, so a copied cookie
tests no token guess offline) is still configured. The CSRF token
of a form is a signature of the session id, so it needs no server-side storage and dies with the session.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import itsdangerous

SESSION_COOKIE = "dygo_session"
FLASH_COOKIE = "dygo_flash"
SESSION_SECONDS = 12 * 3600
SECRET_ENV = "DYGO_SECRET_KEY"


def secret_key(tokens: tuple[tuple[str, str], ...]) -> bytes:
    configured = os.environ.get(SECRET_ENV)
    if configured:
        return configured.encode()
    if tokens:
        material = "\n".join(f"{role}:{token}" for role, token in sorted(tokens))
        return hashlib.sha256(b"dygo-dashboard-session\n" + material.encode()).digest()
    return secrets.token_bytes(32)


class Signer:
    """Signs the dashboard's cookies (the session, a flash message) and makes CSRF tokens, under one key.
    Each use has its own salt, so a signature made for one is never valid for the other."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._cookies = itsdangerous.URLSafeSerializer(
            key, salt="dygo.dashboard.cookie", signer_kwargs={"digest_method": hashlib.sha256}
        )
        self._csrf = itsdangerous.Signer(key, salt="dygo.dashboard.csrf", digest_method=hashlib.sha256)

    def dumps(self, value: dict[str, Any]) -> str:
        return self._cookies.dumps(value)

    def loads(self, signed: str | None) -> dict[str, Any] | None:
        """The value, or None when the text is missing, altered or not ours."""
        if not signed:
            return None
        try:
            value = self._cookies.loads(signed)
        except itsdangerous.BadData:
            return None
        return value if isinstance(value, dict) else None

    def csrf_token(self, sid: str) -> str:
        return self._csrf.get_signature(sid).decode()


@dataclass(frozen=True)
class Session:
    sid: str
    role: str | None  # "admin", "read", or None before login
    expires: float
    token: str | None = None  # the fingerprint of the token it signed in with (app.auth.Tokens.fingerprint)

    @classmethod
    def new(cls, role: str | None = None, token: str | None = None) -> Session:
        return cls(secrets.token_urlsafe(18), role, time.time() + SESSION_SECONDS, token)

    @classmethod
    def read(cls, signer: Signer, cookie: str | None) -> Session | None:
        value = signer.loads(cookie)
        if value is None or not isinstance(value.get("sid"), str) or value.get("exp", 0) < time.time():
            return None
        role = value.get("role")
        token = value.get("tk")
        return cls(
            value["sid"],
            role if role in ("admin", "read") else None,
            float(value["exp"]),
            token if isinstance(token, str) else None,
        )

    def dump(self, signer: Signer) -> str:
        return signer.dumps({"sid": self.sid, "role": self.role, "exp": self.expires, "tk": self.token})
