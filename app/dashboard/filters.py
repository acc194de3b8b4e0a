"""The Jinja2 filters the dashboard's templates use: `ago`, `span`, `took`, `pretty`, `brief` and `stamp`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dygo.store.durations import format_duration

BRIEF_CHARACTERS = 200  # of a stored step result on the job page's timeline


def span(seconds: float | None) -> str:
    """A duration, short: 45s, 3m, 2h, 4d."""
    if seconds is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def ago(value: datetime | None) -> str:
    """How long ago (or, for a time still to come, in how long), short: '3m ago', 'in 2h'."""
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    return f"in {span(-seconds)}" if seconds < 0 else f"{span(seconds)} ago"


def pretty(value: Any) -> str:
    """A job's args, result or error as indented JSON, non-ASCII kept readable."""
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def took(seconds: float | None) -> str:
    """A duration to the millisecond where it is short: 3ms, 1.2s, 2m."""
    return "—" if seconds is None else format_duration(seconds)


def brief(value: Any) -> str:
    """A stored value as one line of JSON, cut to BRIEF_CHARACTERS with an ellipsis."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= BRIEF_CHARACTERS else text[: BRIEF_CHARACTERS - 1] + "…"


def stamp(value: datetime | None) -> str:
    """A moment in full, in UTC: 2030-01-02 03:04:05 UTC."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


FILTERS: dict[str, Callable[..., str]] = {
    "ago": ago,
    "span": span,
    "took": took,
    "pretty": pretty,
    "brief": brief,
    "stamp": stamp,
}
