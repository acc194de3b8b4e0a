"""Logging for the `dygo` processes: diagnostics and per-execution lines on stderr.

Text for people (development), or one JSON object per line (production, or --log-format json).
In text, control characters in a message (a job's error, a kind, a request path) are escaped, so no
value can start a line of its own and pass for a log line (log forging); a traceback is indented.
uvicorn's access log has secret query parameters (`token=`, `api_key=`, ...) replaced by `***`, and so is any
part of a request target equal to a configured token, whatever its place (`hidden_tokens`).

A worker writes one line per job. Written and flushed one by one, those lines cost as much
as running a no-op job, so INFO lines are buffered and flushed every 0.2 s (and at exit);
warnings and errors are flushed at once. The INFO lines of executions that end together come as one
record with a `lines` attribute (worker/execution_log.py); both formatters write one line per entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import parse_qsl, quote, unquote_plus

FLUSH_INTERVAL = 0.2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")
LIFECYCLE_LOGGER = "dygo.lifecycle"  # worker.lifecycle.announce and serve's start-up lines


class BufferedStderrHandler(logging.StreamHandler[TextIO]):
    def __init__(self) -> None:
        stream = open(  # noqa: SIM115
            sys.stderr.fileno(),
            "w",
            buffering=1 << 16,
            encoding="utf-8",
            errors="replace",
            closefd=False,
        )
        super().__init__(stream)
        threading.Thread(target=self._flush_periodically, daemon=True, name="dygo-log-flush").start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + self.terminator)
            if record.levelno >= logging.WARNING:
                self.flush()
        except Exception:
            self.handleError(record)

    def _flush_periodically(self) -> None:
        while True:
            threading.Event().wait(FLUSH_INTERVAL)
            self.flush()


def _control_escapes() -> dict[int, str]:
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
    table.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"})
    return table


CONTROL_ESCAPES = _control_escapes()  # C0, DEL, C1 and the Unicode line and paragraph separators
BLOCK_ESCAPES = {code: text for code, text in CONTROL_ESCAPES.items() if code != ord("\n")}
BLOCK_INDENT = "    "


def escape_controls(text: str) -> str:
    """The text on one line: every control character written as an escape (\\n, \\x1b, \\u2028)."""
    # Every escaped character is unprintable, so printable text (most lines) is returned as it is: the check
    # costs a tenth of the translation, which a worker's log line per job paid in full.
    return text if text.isprintable() else text.translate(CONTROL_ESCAPES)


def indented_block(text: str) -> str:
    """Several lines kept as lines (a traceback), each indented, with every other control character escaped:
    no line of it starts where a log line does."""
    return "\n".join(BLOCK_INDENT + line for line in text.translate(BLOCK_ESCAPES).rstrip("\n").split("\n"))


class TextFormatter(logging.Formatter):
    """FORMAT, one line per record; a record's exception and its `block` (extra={"block": text}: a job's
    traceback) follow as indented lines."""

    def format(self, record: logging.LogRecord) -> str:
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        lines = getattr(record, "lines", None)
        if lines is not None:  # several execution lines in one record (worker/execution_log.py)
            if self._fmt is not None and self._fmt.endswith("%(message)s"):
                # The lines share everything before the message: formatted once, not per line.
                prefix = self._line(record, "")
                return "\n".join(prefix + escape_controls(message) for message, _ in lines)
            return "\n".join(self._line(record, message) for message, _ in lines)
        text = self._line(record, record.getMessage())
        if record.exc_info:
            text += "\n" + indented_block(self.formatException(record.exc_info))
        block = getattr(record, "block", None)
        if block:
            text += "\n" + indented_block(str(block))
        return text

    def _line(self, record: logging.LogRecord, message: str) -> str:
        record.message = escape_controls(message)
        return self.formatMessage(record)


# Query parameters whose values never reach a log line (matched case-insensitively, also as a suffix:
# `x_api_key`, `refresh_token`).
SECRET_PARAMS = (
    "token",
    "access_token",
    "api_key",
    "apikey",
    "key",
    "secret",
    "password",
    "passwd",
    "auth",
    "authorization",
    "bearer",
    "signature",
    "sig",
    "session",
    "csrf",
)
REDACTED = "***"


def _secret(name: str) -> bool:
    name = name.lower()
    return any(name == secret or name.endswith(("_" + secret, "-" + secret)) for secret in SECRET_PARAMS)


def redact_query(path: str) -> str:
    """A request target with the values of secret query parameters replaced by ***."""
    base, mark, query = path.partition("?")
    if not mark or not query:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(_secret(name) for name, _ in pairs):
        return path
    return (
        base
        + "?"
        + "&".join(
            f"{quote(name, safe='')}={REDACTED if _secret(name) else quote(value, safe='/:')}" for name, value in pairs
        )
    )


# The SHA-256 digests of the configured tokens (`hidden_tokens`): a part of a request target that hashes to one
# is redacted, whatever its name or place. Tokens have 16 characters or more; nothing shorter is hashed.
_token_digests: frozenset[bytes] = frozenset()
SHORTEST_TOKEN = 16
_TARGET_PARTS = re.compile(r"([/?&;=,])")


def _token_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def hidden_tokens(tokens: Iterable[str]) -> None:
    """The tokens this process knows (kept as digests), to be redacted from every request target logged."""
    global _token_digests
    _token_digests = frozenset(_token_digest(token) for token in tokens)


def _is_token(part: str) -> bool:
    if len(part) < SHORTEST_TOKEN:
        return False
    decoded = unquote_plus(part)
    return any(
        _token_digest(word) in _token_digests for word in (decoded, *decoded.split()) if len(word) >= SHORTEST_TOKEN
    )


def redact_tokens(target: str) -> str:
    """A request target with every path segment, query name or value (split at / ? & ; = ,), percent-decoded,
    that is a configured token replaced by ***."""
    if not _token_digests:
        return target
    parts = _TARGET_PARTS.split(target)
    if not any(_is_token(part) for part in parts):
        return target
    return "".join(REDACTED if _is_token(part) else part for part in parts)


class RedactAccessLog(logging.Filter):
    """For uvicorn's access logger: its arguments are (client, method, path with query, http version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(redact_tokens(args[2])), *args[3:])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, plus the record's `fields` (extra={"fields":
    {...}}: job_id, kind, queue, attempt, outcome, duration_ms on execution lines) and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        lines = getattr(record, "lines", None)
        if lines is not None:  # several execution lines in one record (worker/execution_log.py)
            return "\n".join(self._object(record, message, fields()) for message, fields in lines)
        return self._object(record, record.getMessage(), getattr(record, "fields", None))

    def _object(self, record: logging.LogRecord, message: str, fields: dict[str, Any] | None) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        if fields:
            data.update(fields)
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def resolve_log_format(flag: str | None, env: str) -> str:
    """--log-format, else $DYGO_LOG_FORMAT, else json in production and text elsewhere."""
    chosen = flag or os.environ.get("DYGO_LOG_FORMAT") or ("json" if env == "production" else "text")
    if chosen not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


def configure_logging(log_format: str = "text") -> None:
    # Skip what every record would otherwise collect and our format never shows: the caller's
    # frame, thread and process names. That halves the cost of a log line.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    level = os.environ.get("DYGO_LOG_LEVEL", "INFO").upper()
    handler = BufferedStderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # Lifecycle lines (started, stopping, stopped) go to stdout, flushed at once: as bare text, or
    # as JSON objects like every other line when the format is json.
    lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
    stdout = logging.StreamHandler(sys.stdout)
    stdout.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter("%(message)s"))
    lifecycle.handlers = [stdout]
    lifecycle.propagate = False
    # Not a log: the lifecycle output is always printed, whatever DYGO_LOG_LEVEL says about stderr.
    lifecycle.setLevel(logging.INFO)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactAccessLog) for f in access.filters):
        access.addFilter(RedactAccessLog())


def flush_then_exit(signum: int, frame: object) -> None:
    """For SIGTERM under uvicorn: it stops gracefully, then raises the signal again against the handler it
    found. This handler flushes the buffered INFO lines (the last access lines, "Shutting down", "Finished
    server process"), which the default handler lost, and exits 0: the stop was graceful, and a process
    manager reads death by the signal (-15) as a crash. Before uvicorn runs, it is a plain exit 0."""
    logging.shutdown()  # flushes every handler
    raise SystemExit(0)
