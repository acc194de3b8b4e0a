"""Durations as people write them in config, flags and the API: "250ms", "30s", "1.5h", "2d" or a number of seconds.

The one grammar: optional spaces or tabs, a number (ASCII digits, maybe a decimal fraction), an optional unit
(ms, s, m, h or d; none means seconds), optional spaces or tabs; never negative, at most a year. `parse_duration`
reads it; `duration_pattern` writes the same language as a regular expression (for the API's OpenAPI
document, which states exactly what the server takes), and tests/test_config.py proves the two agree.
"""

from __future__ import annotations

import re
from decimal import Decimal

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}  # seconds per unit
_MILLISECONDS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_SECONDS = 366 * 86400  # a year: the longest duration dygo takes anywhere
_SPACE = r"[ \t]*"
_GRAMMAR = re.compile(rf"^{_SPACE}(-?)([0-9]+(?:\.[0-9]+)?){_SPACE}(ms|s|m|h|d)?{_SPACE}$")
FORMS = "a number with a unit: ms, s, m, h or d (e.g. '30s')"


def parse_duration(value: str | int | float, *, field: str = "duration") -> float:
    """Return seconds; raise ValueError naming `field` and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a duration like '30s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
        if seconds != seconds:  # NaN compares unequal to itself
            raise ValueError(f"{field}: {value!r} is not a duration")
        if seconds < 0:
            raise ValueError(f"{field}: must not be negative, got {value!r}")
        if seconds > MAX_SECONDS:
            raise ValueError(f"{field}: {value!r} is longer than a year")
        return seconds
    match = _GRAMMAR.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"{field}: {value!r} is not a duration; use {FORMS}")
    sign, number, unit = match.group(1), match.group(2), match.group(3) or "s"
    if sign:
        raise ValueError(f"{field}: must not be negative, got {value!r}")
    amount = float(number)
    most = MAX_SECONDS * 1000 // _MILLISECONDS[unit]  # a year in this unit, a whole number of them
    if amount > most or (amount == most and Decimal(number) > most):
        raise ValueError(f"{field}: {value!r} is longer than a year")
    return amount * UNITS[unit]


def duration_pattern(*, most: int = MAX_SECONDS, units: tuple[str, ...] = tuple(UNITS), positive: bool = False) -> str:
    """The regular expression of the durations `parse_duration` takes that are at most `most` seconds, written
    with one of `units` (a bare number counts as seconds when "s" is one of them), and, if `positive`, more
    than 0. Each unit must hold `most` a whole number of times. Plain ASCII classes only: it means the same to
    Python's re and to the ECMA-262 patterns of JSON Schema."""
    forms = []
    for unit in units:
        limit, rest = divmod(most * 1000, _MILLISECONDS[unit])
        if rest:
            raise ValueError(f"{most} seconds is not a whole number of {unit}")
        number = _number_up_to(limit, positive)
        forms.append(f"{number}(?:{_SPACE}s)?" if unit == "s" else f"{number}{_SPACE}{unit}")
    return f"^{_SPACE}(?:{'|'.join(forms)}){_SPACE}$"


def _number_up_to(limit: int, positive: bool) -> str:
    """A number of the grammar (digits, maybe a fraction) from 0 (or more than 0) to `limit`, a whole number."""
    below = [numbers_up_to(limit - 1)] if limit > 1 else []
    if positive:
        whole = [f"{n}(?:\\.[0-9]+)?" for n in below] + ["0\\.[0-9]*[1-9][0-9]*"]
    else:
        whole = [f"(?:0|{n})(?:\\.[0-9]+)?" for n in below] or ["0(?:\\.[0-9]+)?"]
    whole.append(f"{limit}(?:\\.0+)?")
    return f"0*(?:{'|'.join(whole)})"


def numbers_up_to(most: int) -> str:
    """The regular expression of the whole numbers from 1 to `most`, written without leading zeros."""
    digits = str(most)
    forms = []
    if len(digits) > 1:  # fewer digits than `most`
        forms.append("[1-9]" + (f"[0-9]{{0,{len(digits) - 2}}}" if len(digits) > 2 else ""))
    for i, digit in enumerate(digits):  # as many digits: `most`'s first i, then a smaller one, then any
        low, high = (1 if i == 0 else 0), int(digit) - (0 if i == len(digits) - 1 else 1)
        if high >= low:
            tail = len(digits) - i - 1
            forms.append(digits[:i] + _digits(low, high) + _any_digits(tail))
    return f"(?:{'|'.join(forms)})"


def _digits(low: int, high: int) -> str:
    return str(low) if low == high else f"[{low}-{high}]"


def _any_digits(count: int) -> str:
    return "" if count == 0 else "[0-9]" if count == 1 else f"[0-9]{{{count}}}"


def format_duration(seconds: float) -> str:
    """The short human form used in log lines: 850ms, 12.3s, 4m05s."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"
