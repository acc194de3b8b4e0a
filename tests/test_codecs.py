"""The worker's hand-written codecs (store/codecs.py) against psycopg's own adapters: what PostgreSQL reads
from an array literal is what it reads from psycopg's list dumping, and the claim session's JSON loader
gives what psycopg's loader gives, for inputs that trip a hand-written encoder."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from dygo.store.codecs import array, load_json, plain_array

TEXTS = [
    'a"b',
    "back\\slash",
    '\\"',
    "{brace}",
    "a,b",
    "NULL",
    "null",
    "",
    " spaced ",
    "tab\tnew\nline",
    "é",
    "日本語",
    "😀",
    None,
]
RESULTS = [
    json.dumps({"q": 'say "hi"\\n', "b": "{x}", "u": "é😀"}),
    json.dumps({"q": 'say "hi"\\n'}, ensure_ascii=False),
    json.dumps([1, "a,b", None, 2**70, -0.5, 1.25]),
    json.dumps(""),
    "null",
    "{}",
    None,
]
TOKEN = uuid.uuid4()
WHEN = datetime(2026, 11, 30, 22, 0, 0, 123456, tzinfo=UTC)
ELSEWHERE = datetime(2026, 11, 30, 22, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))

# (the statement's array type, the values a worker statement sends in it)
CASES = [
    ("text", TEXTS),
    ("jsonb", RESULTS),
    ("uuid", [TOKEN, None]),
    ("timestamptz", [WHEN, ELSEWHERE, None]),
    ("float8", [0.25, 1e-05, 600.0, 0.1, -3.5, 1.7976931348623157e308, 5e-324, 0.0, None]),
    ("boolean", [True, False, None]),
    ("bigint", [1, 0, -1, 2**40, 2**63 - 1, -(2**63), None]),
    ("integer", [2**31 - 1, -(2**31), None]),
    ("text", []),
    ("timestamptz", [None]),
]


@pytest.mark.parametrize(("kind", "values"), CASES, ids=[f"{kind}-{i}" for i, (kind, _) in enumerate(CASES)])
def test_an_array_literal_reads_back_as_psycopgs_list_dumping_does(conn, kind, values):
    read = f"SELECT %s::{kind}[]"
    from_literal = conn.execute(read, [array(values)]).fetchone()[0]
    from_list = conn.execute(read, [list(values)]).fetchone()[0]
    assert from_literal == from_list
    if kind == "jsonb":
        assert from_literal == [None if v is None else json.loads(v) for v in values]
    else:
        assert from_literal == values


def test_a_plain_array_of_ids_and_lease_tokens_reads_back_as_psycopgs_list_dumping_does(conn):
    ids = [1, 42, 2**62, 9_223_372_036_854_775_807]
    tokens = [str(uuid.uuid4()) for _ in range(3)]
    read = "SELECT %s::bigint[], %s::uuid[], %s::bigint[]"
    from_literal = conn.execute(read, [plain_array(map(str, ids)), plain_array(tokens), plain_array([])]).fetchone()
    from_list = conn.execute(read, [ids, tokens, []]).fetchone()
    assert from_literal == from_list == (ids, [uuid.UUID(t) for t in tokens], [])


JSONB = [
    "{}",
    "[]",
    '""',
    "null",
    "true",
    "0",
    "-0.5",
    "1e300",
    str(2**70),
    "123456789012345678901234567890.5",
    json.dumps({"nested": {"deep": [[[{"x": [1, 2, {"y": None}]}]]]}}),
    json.dumps({"quote": '"', "backslash": "\\", "controls": "\n\t\r\b\f", "slash": "/"}),
    json.dumps({"é": "é", "日本": "語", "emoji": "😀", "escaped": "\u00e9"}),
    json.dumps({"é": "😀"}, ensure_ascii=False),
    '{"b": 1, "a": 2, "a": 3}',
    '  {"spaced" :  [1 , 2]}  ',
]


def test_the_claim_sessions_json_loader_reads_jsonb_as_psycopgs_loader_does(db_url):
    with (
        psycopg.connect(db_url, autocommit=True) as ours,
        psycopg.connect(db_url, autocommit=True) as psycopgs,
    ):
        psycopg.types.json.set_json_loads(load_json, ours)
        read = "SELECT v::jsonb FROM unnest(%s::text[]) WITH ORDINALITY AS t(v, i) ORDER BY i"
        from_ours = [row[0] for row in ours.execute(read, [JSONB])]
        from_psycopg = [row[0] for row in psycopgs.execute(read, [JSONB])]
    assert from_ours == from_psycopg
    assert from_ours[8] == 2**70 and from_ours[14] == {"a": 3, "b": 1}
