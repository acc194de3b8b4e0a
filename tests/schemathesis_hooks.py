"""Schemathesis hooks for the CLI run of tests/test_api_fuzz.py (SCHEMATHESIS_HOOKS=tests.schemathesis_hooks)."""

from __future__ import annotations

from typing import Any

import schemathesis
from dygo.app.jobs import MAX_WAIT
from dygo.store.durations import parse_duration


def shorter_wait(query: dict[str, Any] | None) -> dict[str, Any] | None:
    """A generated `?wait=` for a job no worker runs holds its request for the whole wait: a valid wait longer
    than a second waits one second instead (any wait of a job that does not end answers the same), and an
    invalid one is left as generated, so that the server still refuses it."""
    wait = (query or {}).get("wait")
    if not isinstance(wait, str):
        return query
    try:
        seconds = parse_duration(wait, field="wait")
    except (TypeError, ValueError):
        return query
    if 1 < seconds <= MAX_WAIT:
        return {**(query or {}), "wait": "1s"}
    return query


@schemathesis.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    return shorter_wait(query)
