"""The worker's one log line per execution (`job 12 email.send attempt 1/5 succeeded in 2ms`).

A LogRecord per execution would be a large share of a short job's cost in the worker (the figures are
in docs/development/decisions.md). So the INFO lines of the executions that end in one turn of the event loop go
out as one record carrying them all (`lines`: message and fields of each); dygo's formatters write one
line per entry (dygo.logs), and any other handler sees the lines joined by newlines. Warnings (a
failure, a dead job) stay a record each, after the INFO lines written before them.

A line's fields (the keys of a JSON line) come as a function that makes them: text lines never ask, so
they never pay for building a dict per job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dygo.worker")

Fields = Callable[[], dict[str, Any]]  # makes a line's fields, for a formatter that writes them (JSON)
Line = tuple[str, Fields]  # the message, and its fields


class ExecutionLog:
    def __init__(self) -> None:
        self.pending: list[Line] = []

    def write(self, level: int, message: str, fields: Fields) -> None:
        if level > logging.INFO:
            self.flush()
            log.log(level, "%s", message, extra={"fields": fields()})
            return
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append((message, fields))

    def flush(self) -> None:
        if not self.pending:
            return
        lines, self.pending = self.pending, []
        log.info("\n".join(message for message, _ in lines), extra={"lines": lines})
