"""One log line when a process loses the database, one when it is back, nothing in between.

During an outage every loop of a worker (claim, settle, renew, maintenance, schedules, LISTEN)
and every request of `serve` fails, each on its own retry timer. Logged one by one, a 30-second
database restart buried the log in hundreds of identical warnings; an operator needs to know when
it started, that the process is retrying, and how long it lasted.
"""

from __future__ import annotations

import logging
import threading
import time

REMINDER_INTERVAL = 300.0  # a long outage is mentioned again this often, so it is not mistaken for a hang

# The pool's own warnings (each failed reconnect, each broken connection discarded) repeat what
# the outage lines say, once per connection and per attempt.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


class OutageLog:
    """Thread-safe: `serve` reports from request threads and its stats thread."""

    def __init__(self, log: logging.Logger, what: str = "database") -> None:
        self.log = log
        self.what = what
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.reminded_at = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def lost(self, where: str, exc: BaseException) -> bool:
        """Record a failure; True when this is the first one of an outage (and was logged)."""
        now = time.monotonic()
        with self.lock:
            if self.down_since is None:
                self.down_since = self.reminded_at = now
                first = True
            elif now - self.reminded_at >= REMINDER_INTERVAL:
                self.reminded_at = now
                self.log.warning(
                    "%s still unreachable after %.0fs (%s: %s)", self.what, now - self.down_since, where, _reason(exc)
                )
                return False
            else:
                return False
        self.log.warning(
            "%s connection lost (%s: %s); retrying with backoff, logging again when it is back",
            self.what,
            where,
            _reason(exc),
        )
        return first

    def back(self) -> bool:
        """Record a success; logs the outage's length when one was under way, and returns True then (once
        per outage). Cheap when none was."""
        if self.down_since is None:
            return False
        with self.lock:
            if self.down_since is None:
                return False
            lasted = time.monotonic() - self.down_since
            self.down_since = None
        self.log.warning("%s connection back after %.1fs", self.what, lasted)
        return True


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
