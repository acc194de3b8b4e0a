"""What counts as "the database is down" (`is_outage`), and one log line when a process loses the
database, one when it is back, nothing in between (`OutageLog`).

During an outage every loop of a worker (claim, settle, renew, maintenance, schedules, LISTEN)
and every request of `serve` fails, each on its own retry timer. Logged one by one, a short
database restart would bury the log in identical warnings; an operator needs to know when it
started, that the process is retrying, and how long it lasted.

An error that is not an outage is never logged here: retrying cannot cure it, so a worker stops on
it (worker/runtime.py) and `serve` answers the request with an error and logs what it was.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

REMINDER_INTERVAL = 300.0  # a long outage is mentioned again this often, so it is not mistaken for a hang

# The pool's own warnings (each failed reconnect, each broken connection discarded) repeat what
# the outage lines say, once per connection and per attempt.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


# SQLSTATE classes a server uses to say it cannot serve now, whatever the statement: 08 connection exception,
# 53 insufficient resources (too many connections, out of memory, disk full), 57P operator intervention
# (administrator or crash shutdown, cannot connect now, idle session timeout, database dropped), and 25006
# read_only_sql_transaction: the server is a standby (or a primary demoted), not the primary; during a
# failover a URL without target_session_attrs=read-write can lead there, and a promotion cures it.
READ_ONLY_SQLSTATE = "25006"
OUTAGE_SQLSTATES = ("08", "53", "57P", READ_ONLY_SQLSTATE)


class NotPrimary(psycopg.OperationalError):
    """The server answered but is read-only (in recovery): not the primary. An outage: wait for a primary."""


# What libpq says when target_session_attrs turns a server down: read-write ("session is read-only") or
# primary ("server is in hot standby mode").
_READ_ONLY_LOGIN = ("session is read-only", "server is in hot standby mode")


def is_read_only(exc: BaseException) -> bool:
    """Whether `exc` says the server is not the primary: a write refused as read-only, a login turned down by
    target_session_attrs, or NotPrimary."""
    if isinstance(exc, NotPrimary):
        return True
    if isinstance(exc, psycopg.Error) and exc.sqlstate == READ_ONLY_SQLSTATE:
        return True
    return isinstance(exc, psycopg.OperationalError) and any(text in str(exc) for text in _READ_ONLY_LOGIN)


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the database cannot be used now (an outage: log it once, retry, stay up), rather
    than that this statement cannot succeed as it is (anything else: a worker stops and exits 1).

    An outage is:

    * an `OSError`: the socket failed (refused, reset, timed out);
    * a psycopg `OperationalError` without a SQLSTATE: libpq's own, for a connection attempt that failed
      (no server there, or it refused the login), a connection lost in the middle of a statement or closed
      already, or a connection pool that gave none in time (`psycopg_pool.PoolTimeout`);
    * a server error of a class in OUTAGE_SQLSTATES: connection exception (08), insufficient resources
      (53, among them too_many_connections), operator intervention (57P: admin_shutdown, crash_shutdown,
      cannot_connect_now), or a write refused because the server is read-only (25006: not the primary).

    Anything else is not an outage, since the same statement would fail the same way: a privilege the
    role lacks (`InsufficientPrivilege`), a table or column missing (`UndefinedTable`, `UndefinedColumn`:
    the schema and the code do not match), a value or parameter refused (`DataError`,
    `InvalidParameterValue`), a statement cancelled by a `statement_timeout` (`QueryCanceled`, 57014) or
    a deadlock (40P01). A deadlock is no outage either, but running the transaction again cures it: the
    worker does (`is_rolled_back`, worker/database.py), since an operator's action on a workflow's jobs
    can hold what a settle or a recovery pass needs. So is a client-side error of psycopg (`ProgrammingError`,
    `InterfaceError`: the driver used wrongly). A failed login is libpq's too and
    has no SQLSTATE: a wrong password counts as an outage, with the server's reason in the lost line.
    """
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        sqlstate = exc.sqlstate
        return sqlstate is None or sqlstate.startswith(OUTAGE_SQLSTATES)
    if isinstance(exc, psycopg.Error):
        return (exc.sqlstate or "").startswith(OUTAGE_SQLSTATES)
    return False


# SQLSTATE class 40, transaction rollback: a deadlock (40P01) or a serialization failure (40001). The server
# rolled the whole transaction back, and the same transaction run again can succeed.
ROLLBACK_SQLSTATE = "40"


def is_rolled_back(exc: BaseException) -> bool:
    """Whether `exc` says the server chose this transaction as a deadlock's victim (or failed to serialize it):
    nothing of it was done, and running it again is the cure. A settle of workflow jobs moves the workflow's
    rows as well, which an operator's action on that workflow may hold (store/workflows.py)."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith(ROLLBACK_SQLSTATE)


def describe(exc: BaseException) -> str:
    """One line naming the error: its type, its SQLSTATE when the server gave one, and the first line of its
    message (`InsufficientPrivilege (SQLSTATE 42501): permission denied for table dygo_jobs`)."""
    lines = str(exc).strip().splitlines()
    sqlstate = getattr(exc, "sqlstate", None)
    name = f"{type(exc).__name__} (SQLSTATE {sqlstate})" if sqlstate else type(exc).__name__
    return f"{name}: {lines[0]}" if lines else name


class OutageLog:
    """Thread-safe: `serve` reports from request threads and its stats thread."""

    def __init__(self, log: logging.Logger, what: str = "database") -> None:
        self.log = log
        self.what = what
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.reminded_at = 0.0
        self.outages = 0  # outages begun so far: a reader that saw this number change knows one happened since

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def lost(self, where: str, exc: BaseException) -> bool:
        """Record a failure; True when this is the first one of an outage (and was logged)."""
        now = time.monotonic()
        with self.lock:
            if self.down_since is None:
                self.down_since = self.reminded_at = now
                self.outages += 1
                first = True
            elif now - self.reminded_at >= REMINDER_INTERVAL:
                self.reminded_at = now
                self.log.warning(
                    "%s still unreachable after %.0fs (%s: %s)", self.what, now - self.down_since, where, describe(exc)
                )
                return False
            else:
                return False
        self.log.warning(
            "%s connection lost (%s: %s)%s; retrying with backoff, logging again when it is back",
            self.what,
            where,
            describe(exc),
            " - the server is read-only, not the primary: looking for the primary" if is_read_only(exc) else "",
        )
        return first

    def _end_outage(self) -> float | None:
        """When the outage under way began, or None when there is none; there is none afterwards."""
        with self.lock:
            down_since, self.down_since = self.down_since, None
            return down_since

    def back(self) -> bool:
        """Record a success; logs the outage's length when one was under way, and returns True then (once
        per outage). Cheap when none was."""
        if self.down_since is None:
            return False
        down_since = self._end_outage()
        if down_since is None:  # another thread logged this outage's end
            return False
        lasted = time.monotonic() - down_since
        self.log.warning("%s connection back after %.1fs", self.what, lasted)
        return True
