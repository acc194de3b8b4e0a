"""Logging for the `dygo` processes: diagnostics and per-execution lines on stderr.

A worker writes one line per job. Written and flushed one by one, those lines cost as much
as running a no-op job, so INFO lines are buffered and flushed every 0.2 s (and at exit);
warnings and errors are flushed at once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

FLUSH_INTERVAL = 0.2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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


def configure_logging() -> None:
    # Skip what every record would otherwise collect and our format never shows: the caller's
    # frame, thread and process names. That halves the cost of a log line.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    level = os.environ.get("DYGO_LOG_LEVEL", "INFO").upper()
    handler = BufferedStderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
