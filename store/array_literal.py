"""PostgreSQL array literals for the worker's statement parameters (the claim's and the settle's arrays).

A parameter the statement casts to its array type (`%(ids)s::bigint[]`) is sent as one literal, text of
unknown type, rather than as a Python list: psycopg's list dumping first looks through each list for its
element type and a dumper for it, which costs the worker more than the literal's text. What the server reads
back is the same as from psycopg's own list dumping (tests/test_array_literal.py).
"""

from __future__ import annotations

from collections.abc import Iterable


def array(values: Iterable[object]) -> str:
    """An array literal of `values` (None: NULL). Every element is quoted, with backslash and double quote
    escaped: what any element type's input reads."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
        )
        + "}"
    )


def plain_array(texts: Iterable[str]) -> str:
    """An array literal of elements whose text needs no quoting: integers, and uuids (the settle's ids and
    lease tokens), without `array`'s per-element quoting."""
    return "{" + ",".join(texts) + "}"
