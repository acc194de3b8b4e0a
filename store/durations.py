"""Durations as people write them in config and flags: "250ms", "30s", "5m", "1h", "2d" or a number of seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(value: str | int | float, *, field: str = "duration") -> float:
    """Return seconds; raise ValueError naming `field` and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a duration like '30s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _PATTERN.match(str(value))
        if not match:
            raise ValueError(
                f"{field}: {value!r} is not a duration; use a number with a unit: ms, s, m, h or d (e.g. '30s')"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds != seconds:  # NaN compares unequal to itself
        raise ValueError(f"{field}: {value!r} is not a duration")
    if seconds < 0:
        raise ValueError(f"{field}: must not be negative, got {value!r}")
    if seconds > 366 * 86400:
        raise ValueError(f"{field}: {value!r} is longer than a year")
    return seconds


def format_duration(seconds: float) -> str:
    """The short human form used in log lines: 850ms, 12.3s, 4m05s."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"
