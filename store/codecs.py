"""The worker's hand-written codecs: PostgreSQL array literals for the claim's and the settle's parameters,
and the claim session's JSON loader. Each replaces a psycopg adapter on the worker's hot path because it
costs the worker clearly less per claim or settle (bench/claim_encoding.py), and each gives what psycopg's
adapter gives: the same values read back from PostgreSQL (tests/test_codecs.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def array(values: Iterable[object]) -> str:
    """An array literal of `values` (None: NULL), for a parameter the statement casts to its array type
    (`%(ids)s::bigint[]`): sent as one text of unknown type, where psycopg's list dumping first looks through
    each list for its element type and a dumper for it. Every element is quoted, with backslash and double
    quote escaped: what any element type's input reads."""
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


# psycopg hands its JSON loader the bytes of a json or jsonb value, and json.loads first works out their
# encoding and skips whitespace. The server sends jsonb as UTF-8 text (the connection's client_encoding, as
# json.loads assumes of bytes too) with no whitespace around the value, so the bytes are decoded as UTF-8 and
# the value read at once.
_decode_json = json.JSONDecoder().raw_decode


def load_json(data: str | bytes) -> Any:
    """A jsonb value from the server's bytes (psycopg.types.json.set_json_loads). Not for a json column: it
    keeps its input's whitespace, which this does not skip."""
    return _decode_json(data if isinstance(data, str) else data.decode())[0]
