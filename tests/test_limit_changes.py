"""Changing a limit through PUT /api/v1/limits against a real `dygo serve`: the file's rules, a field left out
kept, a limit removed only by an explicit null, and a refused body that changes nothing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.shared_database

LIMIT = "/api/v1/limits/kind/test.limited"
IN_FORCE = {"concurrency_limit": 3, "rate_limit": "10/s", "rate_burst": 2, "key": "meta.tenant"}


def stored(conn) -> tuple:
    row = conn.execute(
        "SELECT concurrency_limit, rate_count, rate_window, rate_burst, key FROM dygo_limits "
        "WHERE scope = 'kind' AND name = 'test.limited'"
    ).fetchone()
    return tuple(row) if row else ()


@pytest.fixture
def limited(api, conn):
    """test.limited under IN_FORCE, as the test starts."""
    answer = api.admin.put(LIMIT, json={**IN_FORCE})
    assert answer.status_code == 200, answer.text
    assert stored(conn) == (3, 10, 1.0, 2, "tenant")
    return api


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency_limit": "5"}, "concurrency_limit"),
        ({"concurrency_limit": True}, "concurrency_limit"),
        ({"concurrency_limit": 0}, "concurrency_limit"),
        ({"concurrency_limit": 2.5}, "concurrency_limit"),
        ({"concurrency_limit": 1_000_001}, "concurrency_limit"),
        ({"rate_limit": 30}, "rate_limit"),
        ({"rate_limit": "\u0663\u0660/s"}, "rate_limit"),  # Arabic-Indic digits
        ({"rate_limit": "1_0/s"}, "rate_limit"),
        ({"rate_burst": "2"}, "rate_burst"),
        ({"rate_burst": 11}, "rate_burst"),  # more than the rate's count
        ({"key": "meta.tenant"}, "key"),  # a key without a limit in the same change
        ({"key": "tenant", "concurrency_limit": 3}, "key"),
        ({"key": "meta." + "t" * 300, "concurrency_limit": 3}, "key"),
        ({"key": "meta.tenant\n", "concurrency_limit": 3}, "key"),
        ({"key": 5, "concurrency_limit": 3}, "key"),
        ({"concurrency_limit": 3, "burst": 2}, "burst"),
    ],
)
def test_a_bad_limit_change_gets_422_naming_the_field_and_changes_nothing(limited, conn, body, field):
    answer = limited.admin.put(LIMIT, json=body)
    assert answer.status_code == 422, (body, answer.text)
    error = answer.json()["error"]
    named = [detail["loc"][-1] for detail in error["details"]] if isinstance(error["details"], list) else []
    assert field in named or (error["details"] or {}).get("field") == field, error
    assert stored(conn) == (3, 10, 1.0, 2, "tenant")


def test_a_field_left_out_keeps_its_value_and_only_an_explicit_null_removes_a_limit(limited, conn):
    answer = limited.admin.put(LIMIT, json={"concurrency_limit": 7})
    assert answer.status_code == 200 and answer.json()["rate_limit"] == "10/s"
    assert stored(conn) == (7, 10, 1.0, 2, "tenant")
    assert limited.admin.put(LIMIT, json={"rate_limit": None}).status_code == 200
    assert stored(conn) == (7, None, None, None, "tenant")  # the burst goes with its rate
    assert limited.admin.put(LIMIT, json={"concurrency_limit": None}).json()["concurrency_limit"] is None
    assert stored(conn) == (None, None, None, None, None)  # no limit left: its key goes too
