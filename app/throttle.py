"""Failed-token throttle: too many wrong tokens from one client address lock it out for a while.

One count for both ways of presenting a token, API bearer tokens and the dashboard's sign-in, kept in
the database (store/auth_state.py), so every `dygo serve` process and a restart see the same count:
with N processes behind a balancer an address still gets LOGIN_ATTEMPTS tries, not N times as many.
While an address is locked out even the right token is refused: guessing must not pay off.
"""

from __future__ import annotations

from typing import Any

from store import auth_state

LOGIN_ATTEMPTS = 5  # wrong tokens from one address within LOGIN_WINDOW before it is locked out
LOGIN_WINDOW = 300.0  # seconds


class AuthThrottle:
    """Wrong tokens per client address over a sliding window, in the database. Blocking calls: from a
    thread (a sync route, or run_in_threadpool)."""

    def __init__(self, state: Any, attempts: int = LOGIN_ATTEMPTS, window: float = LOGIN_WINDOW) -> None:
        self.state = state  # the app's state: its pool exists once the app has started
        self.attempts, self.window = attempts, window

    def _connection(self):
        from app.db import OUTAGE_WAIT

        return self.state.pool.connection(timeout=OUTAGE_WAIT if self.state.outage.down else None)

    def locked_until(self, address: str) -> float | None:
        """When (time.time()) the address may try again, or None if it may try now."""
        with self._connection() as conn:
            return auth_state.locked_until(conn, address, self.attempts, self.window)[1]

    def admit(self, address: str) -> float | None:
        """For a right token: None (and the address's failures forgotten), or when it may try again."""
        with self._connection() as conn:
            recorded, until = auth_state.locked_until(conn, address, self.attempts, self.window)
            if until is None and recorded:
                auth_state.clear_failures(conn, address)
            return until

    def failed(self, address: str) -> float | None:
        """Count a wrong token; when the address may try again if this locked it out."""
        with self._connection() as conn:
            return auth_state.failed_attempt(conn, address, self.attempts, self.window)

    def succeeded(self, address: str) -> None:
        with self._connection() as conn:
            auth_state.clear_failures(conn, address)
