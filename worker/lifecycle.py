"""The worker's lifecycle lines on stdout (started, ready, stopping, stopped): not log lines."""

from __future__ import annotations

import logging
import sys

lifecycle = logging.getLogger("dygo.lifecycle")  # stdout; configured by dygo.logs


def announce(line: str, **fields: object) -> None:
    """Lifecycle lines go to stdout; everything else is a log line on stderr. The `dygo` command sets
    up the lifecycle logger (text or JSON with these fields); without it, a plain print."""
    if lifecycle.handlers:
        lifecycle.info(line, extra={"fields": fields})
    else:
        print(line, file=sys.stdout, flush=True)
