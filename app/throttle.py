"""Failed-token throttle: too many wrong tokens from one client address lock it out for a while.

One count for both ways of presenting a token, API bearer tokens and the dashboard's sign-in, kept in
the database (store/auth_state.py), so every `dygo serve` process and a restart see the same count:
with N processes behind a balancer an address still gets LOGIN_ATTEMPTS tries, not N times as many.
While an address is locked out even the right token is refused: guessing must not pay off.
"""

from __future__ import annotations

from typing import Any

import psycopg
from dygo.store import auth_state

LOGIN_ATTEMPTS = 5  # wrong tokens from one address within LOGIN_WINDOW before it is locked out
LOGIN_WINDOW = 300.0  # seconds


class AuthThrottle:
    """Wrong tokens per client address over a sliding window, in the database. The API's bearer check
    runs on the event loop with the hot async pool (`admit`, `failed`); the dashboard's sign-in, a sync
    endpoint, passes the connection its `Conn` dependency holds (`locked_until_on`, `failed_on`,
    `succeeded_on`), so no thread ever waits for a connection (app/db.py)."""

    def __init__(self, state: Any, attempts: int = LOGIN_ATTEMPTS, window: float = LOGIN_WINDOW) -> None:
        self.state = state  # the app's state: its database (app/db.py) exists once the app has started
        self.attempts, self.window = attempts, window

    async def admit(self, address: str) -> float | None:
        """For a right token: None (and the address's failures forgotten), or when it may try again."""
        async with self.state.db.connection() as conn:
            recorded, until = await auth_state.alocked_until(conn, address, self.attempts, self.window)
            if until is None and recorded:
                await auth_state.aclear_failures(conn, address)
            return until

    async def failed(self, address: str) -> float | None:
        """Count a wrong token; when the address may try again if this locked it out."""
        async with self.state.db.connection() as conn:
            return await auth_state.afailed_attempt(conn, address, self.attempts, self.window)

    def locked_until_on(self, conn: psycopg.Connection, address: str) -> float | None:
        """When (time.time()) the address may try again, or None if it may try now."""
        return auth_state.locked_until(conn, address, self.attempts, self.window)[1]

    def failed_on(self, conn: psycopg.Connection, address: str) -> float | None:
        return auth_state.failed_attempt(conn, address, self.attempts, self.window)

    def succeeded_on(self, conn: psycopg.Connection, address: str) -> None:
        auth_state.clear_failures(conn, address)
