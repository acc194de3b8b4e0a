"""Failed-token throttle: too many wrong tokens from one client address lock it out for a while, and too
many from all addresses together stop tokens from new addresses being tried.

An IPv6 client counts by its /64 network (one host usually holds a whole /64), an IPv4 one by its address.
Spreading guesses over many addresses does not reset the count either: every wrong token also counts in a
global budget (`failed_token_global_limit` within the window). Once it is spent, a token (right or wrong)
from an address this process has not let in with a right token in the last window is refused unchecked
and unrecorded, until the budget's oldest failure leaves the window: clients already working keep working,
guessing from fresh addresses gets nothing, and writes nothing.

One count for both ways of presenting a token, API bearer tokens and the dashboard's sign-in, kept in
the database (store/auth_state.py), so every `dygo serve` process and a restart see the same count:
with N processes behind a balancer an address still gets LOGIN_ATTEMPTS tries, not N times as many.
While an address is locked out even the right token is refused: guessing must not pay off.

A right token does not cost a database read: that read would be a second round trip on every single
enqueue. Each recorded failure is notified with its address (store/auth_state.py), and every
serve process listens (app/listening.py): the throttle keeps the addresses with failures heard of in
the last window, the *suspects*, and reads the table only for them. An address whose newest failure is
older than the window cannot be locked out, so a suspect is forgotten after a window of silence, or
once a read finds it has no failures on record. Whenever notifications cannot be relied on (the LISTEN
connection is down or not yet caught up, or it goes through a transaction pooler), every right token is
read in the table, as before. Wrong tokens are always recorded in the table, so a flood of them is
counted across processes whatever this process has heard.
"""

from __future__ import annotations

import ipaddress
import itertools
import time
from typing import Any

import psycopg
from dygo.store import auth_state

LOGIN_ATTEMPTS = 5  # wrong tokens from one address within LOGIN_WINDOW before it is locked out
LOGIN_WINDOW = 300.0  # seconds
GLOBAL_ATTEMPTS = 100  # wrong tokens from all addresses together within the window
ALL_ADDRESSES = "(all addresses)"  # the global budget's key in the table: never a client address
PRUNE_EVERY = 1024  # suspects added between two sweeps of the ones whose window has passed


class AuthThrottle:
    """Wrong tokens per client address over a sliding window, in the database. The API's bearer check
    runs on the event loop with the hot async pool (`admit`, `failed`); the dashboard's sign-in, a sync
    endpoint, passes the connection its `Conn` dependency holds (`locked_until_on`, `failed_on`,
    `succeeded_on`), so no thread ever waits for a connection (app/db.py).

    A subscriber of ServeListener (app/listening.py) when notifications can be relied on."""

    channels = (auth_state.AUTH_FAILURE_CHANNEL,)

    def __init__(
        self,
        state: Any,
        attempts: int = LOGIN_ATTEMPTS,
        window: float = LOGIN_WINDOW,
        global_attempts: int = GLOBAL_ATTEMPTS,
    ) -> None:
        self.state = state  # the app's state: its database (app/db.py) exists once the app has started
        self.attempts, self.window, self.global_attempts = attempts, window, global_attempts
        # client key -> monotonic time this process last let it in with a right token: these clients keep
        # working while the global budget is spent.
        self.trusted: dict[str, float] = {}
        self.heard = -window  # monotonic time of the latest failure heard of, from any address
        # True while the listener is connected and has caught up: only then may a right token from an
        # address that is not a suspect be admitted without a read. Written by the listener only.
        self.listening_now = False
        # address -> (mark, monotonic time its newest failure was heard of). Written by the listener and
        # by this process's own failures; `admit` drops an entry only if its mark did not change meanwhile.
        self.suspects: dict[str, tuple[int, float]] = {}
        self._marks = itertools.count()
        self._added = 0

    async def admit(self, address: str) -> float | None:
        """For a right token: None (and the address's failures forgotten), or when it may try again."""
        key = client_key(address)
        suspect = not self.listening_now or self._suspect(key)
        if not suspect and (self._trusted(key) or not self._guessing_anywhere()):
            self._trust(key)
            return None
        seen = self.suspects.get(key)
        async with self.state.db.connection() as conn:
            until = await self._aglobal_lock(conn, key)
            if until is not None:
                return until
            if suspect:
                recorded, until = await auth_state.alocked_until(conn, key, self.attempts, self.window)
                if until is None and recorded:
                    await auth_state.aclear_failures(conn, key)
        if until is None:
            self._trust(key)
            if suspect and self.suspects.get(key) == seen:
                self.suspects.pop(key, None)  # no failure since the read: nothing left to check
        return until

    async def failed(self, address: str) -> float | None:
        """Count a wrong token; when the address may try again if this locked it out (or the global budget is
        spent, in which case nothing is recorded)."""
        key = client_key(address)
        self.suspect(key)  # before the write: a right token racing this one is read, not admitted
        async with self.state.db.connection() as conn:
            until = await self._aglobal_lock(conn, key)
            if until is not None:
                return until
            await auth_state.afailed_attempt(conn, ALL_ADDRESSES, self.global_attempts, self.window)
            return await auth_state.afailed_attempt(conn, key, self.attempts, self.window)

    def locked_until_on(self, conn: psycopg.Connection, address: str) -> float | None:
        """When (time.time()) the address may try again, or None if it may try now."""
        key = client_key(address)
        until = self._global_lock(conn, key)
        return until if until is not None else auth_state.locked_until(conn, key, self.attempts, self.window)[1]

    def failed_on(self, conn: psycopg.Connection, address: str) -> float | None:
        key = client_key(address)
        self.suspect(key)
        until = self._global_lock(conn, key)
        if until is not None:
            return until
        auth_state.failed_attempt(conn, ALL_ADDRESSES, self.global_attempts, self.window)
        return auth_state.failed_attempt(conn, key, self.attempts, self.window)

    def succeeded_on(self, conn: psycopg.Connection, address: str) -> None:
        key = client_key(address)
        auth_state.clear_failures(conn, key)
        self._trust(key)

    # --- the global budget ------------------------------------------------------------------------------

    def _trust(self, key: str) -> None:
        self.trusted[key] = time.monotonic()
        if len(self.trusted) > PRUNE_EVERY:
            cutoff = time.monotonic() - self.window
            for stale in [k for k, at in list(self.trusted.items()) if at < cutoff]:
                self.trusted.pop(stale, None)

    def _trusted(self, key: str) -> bool:
        at = self.trusted.get(key)
        return at is not None and at > time.monotonic() - self.window

    def _guessing_anywhere(self) -> bool:
        """Whether a failure from any address was heard of in the last window (then the budget is read)."""
        return self.heard > time.monotonic() - self.window

    async def _aglobal_lock(self, conn: psycopg.AsyncConnection, key: str) -> float | None:
        if self._trusted(key):
            return None
        return (await auth_state.alocked_until(conn, ALL_ADDRESSES, self.global_attempts, self.window))[1]

    def _global_lock(self, conn: psycopg.Connection, key: str) -> float | None:
        if self._trusted(key):
            return None
        return auth_state.locked_until(conn, ALL_ADDRESSES, self.global_attempts, self.window)[1]

    # --- the suspects ---------------------------------------------------------------------------------

    def suspect(self, address: str) -> None:
        """A failure of `address` (a client key) was recorded (here, or notified by any process)."""
        self.heard = time.monotonic()
        self.suspects[address] = (next(self._marks), self.heard)
        self._added += 1
        if self._added >= PRUNE_EVERY:
            self._added = 0
            cutoff = time.monotonic() - self.window
            # A copy first: the dashboard's sign-in records failures from a threadpool thread.
            for stale in [a for a, (_, heard) in list(self.suspects.items()) if heard < cutoff]:
                self.suspects.pop(stale, None)

    def _suspect(self, address: str) -> bool:
        if not auth_state.notified(address):
            return True  # its failures are not notified: always read
        entry = self.suspects.get(address)
        # Heard of no later than it happened: once a window has passed since, none of its failures counts.
        return entry is not None and entry[1] > time.monotonic() - self.window

    async def listening(self, conn: psycopg.AsyncConnection) -> None:
        for address in await auth_state.alisten_for_failures(conn):
            self.suspect(address)
        self.listening_now = True

    def notified(self, channel: str, payload: str) -> None:
        self.suspect(payload)

    def deaf(self) -> None:
        self.listening_now = False


def client_key(address: str) -> str:
    """What failures are counted by: an IPv4 address (an IPv4-mapped IPv6 one too), the /64 network of an
    IPv6 address, anything else (a name a proxy sent) as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
