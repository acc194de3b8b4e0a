"""Logging for the `dygo` processes: diagnostics and per-execution lines on stderr.

Text for people (development), or one JSON object per line (production, or --log-format json).

A worker writes one line per job. Written and flushed one by one, those lines cost as much
as running a no-op job, so INFO lines are buffered and flushed every 0.2 s (and at exit);
warnings and errors are flushed at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any

FLUSH_INTERVAL = 0.2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")
LIFECYCLE_LOGGER = "dygo.lifecycle"  # worker.lifecycle.say and serve's start-up lines


class BufferedStderrHandler(logging.StreamHandler):
    def __init__(self) -> None:
        stream = open(sys.stderr.fileno(), "w", buffering=1 << 16, encoding="utf-8",  # noqa: SIM115
                      errors="replace", closefd=False)
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, plus the record's `fields` (extra={"fields":
    {...}}: job_id, kind, queue, attempt, outcome, duration_ms on execution lines) and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
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
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    level = os.environ.get("DYGO_LOG_LEVEL", "INFO").upper()
    handler = BufferedStderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # Lifecycle lines (started, stopping, stopped) go to stdout, flushed at once: as bare text, or
    # as JSON objects like every other line when the format is json.
    lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
    stdout = logging.StreamHandler(sys.stdout)
    stdout.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter("%(message)s"))
    lifecycle.handlers = [stdout]
    lifecycle.propagate = False


def flush_then_die(signum: int, frame: object) -> None:
    """For SIGTERM under uvicorn: it stops gracefully, then raises the signal again against the handler it
    found, to end "by the signal". With the default handler the process died before the buffered INFO
    lines (the last access lines, "Shutting down", "Finished server process") reached stderr."""
    logging.shutdown()  # flushes every handler
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
