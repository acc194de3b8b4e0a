"""Login rate limiting: too many failed sign-ins from one client address lock it out for a while.

In memory, per `dygo serve` process: each process (and each restart) counts on its own, so with N
processes behind a balancer an address gets up to N times the attempts. Enough to turn guessing a
token through the login form into a slow crawl; not a shared, durable limiter.
"""

from __future__ import annotations

import threading
import time
from collections import deque

LOGIN_ATTEMPTS = 5  # failed sign-ins from one address within LOGIN_WINDOW before it is locked out
LOGIN_WINDOW = 300.0  # seconds
MAX_ADDRESSES = 10_000  # addresses remembered at once; the stalest go first, so memory stays bounded


class LoginThrottle:
    """Failed sign-ins per client address over a sliding window."""

    def __init__(self, attempts: int = LOGIN_ATTEMPTS, window: float = LOGIN_WINDOW) -> None:
        self.attempts, self.window = attempts, window
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def locked_until(self, address: str, now: float | None = None) -> float | None:
        """When (time.time()) the address may try again, or None if it may try now."""
        now = time.time() if now is None else now
        with self._lock:
            recent = self._recent(address, now)
            if recent is not None and len(recent) >= self.attempts:
                return recent[-self.attempts] + self.window
        return None

    def failed(self, address: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            recent = self._recent(address, now)
            if recent is None:
                if len(self._failures) >= MAX_ADDRESSES:
                    self._forget_stalest()
                recent = self._failures[address] = deque(maxlen=self.attempts)
            recent.append(now)

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)

    def _recent(self, address: str, now: float) -> deque[float] | None:
        recent = self._failures.get(address)
        if recent is None:
            return None
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        if not recent:
            del self._failures[address]
            return None
        return recent

    def _forget_stalest(self) -> None:
        stalest = min(self._failures, key=lambda address: self._failures[address][-1])
        del self._failures[stalest]
