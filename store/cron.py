"""Cron specs: validation, the next fire time in a named time zone, and a description in words.

A spec is 5 fields (minute hour day-of-month month day-of-week) or a descriptor such as `@hourly`.
Fire times follow the wall clock of the schedule's time zone, with these rules on DST days:

* a wall time skipped by spring-forward (02:30 when clocks jump from 02:00 to 03:00) fires once,
  shifted forward by the jump (03:30), the PEP 495 reading of a time in the gap; when that lands on
  another occurrence (as it does for hourly specs) the two are one fire;
* a wall time repeated by fall-back fires once, on its first pass, when the spec names its hours
  (`30 1 * * *`); a spec whose hour field starts with `*` (`*/15 * * * *`, `0 * * * *`) runs on
  real elapsed time, so it fires on both passes. This is Vixie cron's rule.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = "minute hour day-of-month month day-of-week"
# Larger than any clock shift in the tz database (1 h almost everywhere, 2 h at most).
DST_MARGIN = timedelta(hours=3)
MAX_CANDIDATES = 5000  # ~4 days of a per-minute spec: far more than any DST window needs


def expand(spec: str) -> str:
    """The 5-field form of `spec` (descriptors expanded, whitespace normalised)."""
    spec = spec.strip()
    if spec.startswith("@"):
        return DESCRIPTORS[spec.lower()]
    return " ".join(spec.split())


def validate(spec: object) -> str:
    """Return the 5-field form of `spec`, or raise ValueError with the rule it breaks."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"must be a cron expression like '*/5 * * * *' or a descriptor like '@hourly', got {spec!r}")
    if spec.strip().startswith("@") and spec.strip().lower() not in DESCRIPTORS:
        raise ValueError(f"unknown descriptor {spec.strip()!r}; use one of {', '.join(DESCRIPTORS)}")
    fields = expand(spec)
    if len(fields.split()) != 5:
        raise ValueError(f"{spec!r} must have 5 fields ({FIELDS}), it has {len(fields.split())}")
    try:
        croniter(fields, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError(f"{spec!r} never fires (no calendar date matches it)") from None
    except CroniterError as exc:
        raise ValueError(f"{spec!r} is not a valid cron expression: {exc}") from None
    return fields


def zone(name: object) -> ZoneInfo:
    """The IANA time zone `name`, or ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"must be an IANA time zone name like 'Europe/Paris', got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone name (e.g. 'UTC', 'America/New_York')") from None


# --- the next fire time ---------------------------------------------------------------------------


def next_fire(spec: str, tz: str | ZoneInfo, after: datetime) -> datetime:
    """The first fire time strictly after `after` (an aware datetime), as an aware UTC datetime."""
    where = tz if isinstance(tz, ZoneInfo) else zone(tz)
    fields = expand(spec)
    real_time = fields.split()[1].startswith("*")
    # Compare instants in UTC only: Python compares two datetimes sharing a tzinfo by wall time.
    after = after.astimezone(UTC)
    candidates = croniter(fields, _wall(after, where) - _margin(where, after))
    best: datetime | None = None
    for _ in range(MAX_CANDIDATES):
        wall = candidates.get_next(datetime)
        # Wall-clock order only disagrees with real time within a DST margin of a transition.
        if best is not None and wall > _wall(best, where) + _margin(where, best):
            return best
        for instant in _instants(wall, where, real_time):
            if instant > after and (best is None or instant < best):
                best = instant
    if best is None:
        raise ValueError(f"{spec!r} has no fire time after {after.isoformat()}")
    return best


def _wall(instant: datetime, where: ZoneInfo) -> datetime:
    return instant.astimezone(where).replace(tzinfo=None)


def _margin(where: ZoneInfo, instant: datetime) -> timedelta:
    """DST_MARGIN when the zone changes its offset within it of `instant`, else nothing to look around."""
    offsets = {(instant + step).astimezone(where).utcoffset() for step in (-DST_MARGIN, timedelta(0), DST_MARGIN)}
    return DST_MARGIN if len(offsets) > 1 else timedelta(0)


def _instants(wall: datetime, where: ZoneInfo, real_time: bool) -> list[datetime]:
    """The moments a matching wall time stands for: one, none extra in a gap, one or two in an overlap."""
    first = wall.replace(tzinfo=where, fold=0)
    second = wall.replace(tzinfo=where, fold=1)
    if first.utcoffset() == second.utcoffset() or _wall(first, where) != wall:
        # An ordinary time, or one skipped by spring-forward: fold=0 reads it with the offset before
        # the jump, which lands it the length of the jump later (02:30 -> 03:30).
        return [first.astimezone(UTC)]
    if real_time:
        return [first.astimezone(UTC), second.astimezone(UTC)]
    return [first.astimezone(UTC)]


# --- in words -------------------------------------------------------------------------------------

DAY_NAMES = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTH_NAMES = [
    "",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DAY_ALIASES = {name[:3].lower(): str(i) for i, name in enumerate(DAY_NAMES[:7])}
_MONTH_ALIASES = {name[:3].lower(): str(i) for i, name in enumerate(MONTH_NAMES) if name}


def describe(spec: str) -> str:
    """A short description in words of the common patterns; the fields spelled out for the rest."""
    try:
        fields = expand(spec)
        minute, hour, dom, month, dow = fields.lower().split()
    except (KeyError, ValueError):
        return spec
    time_words = _time_of_day(minute, hour)
    days = _days(dom, _names_to_numbers(month, _MONTH_ALIASES), _names_to_numbers(dow, _DAY_ALIASES))
    if time_words is None or days is None:
        spelled = zip(FIELDS.split(), fields.split(), strict=True)
        return ", ".join(f"{name} {value}" for name, value in spelled)
    if time_words.startswith("at "):
        return f"{days or 'every day'} {time_words}"  # every day at 02:30, on weekdays at 09:00
    days = re.sub(r"^every (year )?(on )?", "on ", days)
    return f"{time_words} {days}".strip()  # every 5 minutes, every hour at :15 on Monday


def _days(dom: str, month: str, dow: str) -> str | None:
    """The days part: '' for every day, None when it is not a common pattern."""
    if dom == "*" and month == "*":
        return _days_of_week(dow)
    days = dom.split(",")
    if dow not in ("*", "?") or not all(d.isdigit() for d in days):
        return None
    if month == "*":
        return f"on day{'s' if len(days) > 1 else ''} {_and(days)} of every month"
    if len(days) > 1:
        return None
    if month.isdigit() and 1 <= int(month) <= 12:
        return f"every year on {MONTH_NAMES[int(month)]} {dom}"
    return None


def _time_of_day(minute: str, hour: str) -> str | None:
    if minute == "*" and hour == "*":
        return "every minute"
    if hour == "*":
        if minute.startswith("*/") and minute[2:].isdigit():
            return f"every {minute[2:]} minutes"
        if minute.isdigit():
            return f"every hour at :{int(minute):02d}"
        return None
    if not minute.isdigit():
        return None
    if hour.startswith("*/") and hour[2:].isdigit():
        return f"every {hour[2:]} hours at :{int(minute):02d}"
    first, _, last = hour.partition("-")
    if first.isdigit() and last.isdigit():
        start, end = (f"{int(h):02d}:{int(minute):02d}" for h in (first, last))
        return f"every hour from {start} to {end}"
    hours = hour.split(",")
    if all(h.isdigit() for h in hours):
        return "at " + _and([f"{int(h):02d}:{int(minute):02d}" for h in hours])
    return None


def _days_of_week(dow: str) -> str | None:
    if dow in ("*", "?"):
        return ""
    if dow == "1-5":
        return "on weekdays"
    if set(dow.split(",")) in ({"0", "6"}, {"6", "7"}):
        return "on weekends"
    days = dow.split(",")
    if all(d.isdigit() and int(d) <= 7 for d in days):
        return "every " + _and([DAY_NAMES[int(d)] for d in days])
    return None


def _names_to_numbers(field: str, aliases: dict[str, str]) -> str:
    for name, number in aliases.items():
        field = field.replace(name, number)
    return field


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
