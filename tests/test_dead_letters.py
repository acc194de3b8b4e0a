"""Dead-letter groups (store.admin), without a browser."""

from __future__ import annotations

from dygo.store import admin

UUID_A, UUID_B = "0b1e2f7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "9f8e7d6c-5b4a-4321-9876-fedcba987654"


def dead(conn, kind: str, error: str, key: str | None = None) -> int:
    return conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, finished_at, last_error, dead_fingerprint, idempotency_key, "
        "errors) VALUES (%s, 'default', 'dead', now(), %s, dygo_error_fingerprint(%s), %s, "
        "jsonb_build_array(jsonb_build_object('attempt', 1, 'error', %s::text, "
        "'traceback', 'Traceback: ' || %s::text))) RETURNING id",
        (kind, error, error, key, error, error),
    ).fetchone()[0]


def test_dead_jobs_group_by_kind_and_normalised_error(conn):
    dead(conn, "mail.send", f"KeyError: user {UUID_A} at 0x7f3a12 missing")
    newest = dead(conn, "mail.send", f"KeyError: user {UUID_B} at 0x7f0000 missing\nmore detail")
    dead(conn, "mail.send", "TimeoutError: after 30 seconds")
    dead(conn, "bill.charge", "TimeoutError: after 45 seconds")
    conn.execute("INSERT INTO dygo_jobs (kind, queue) VALUES ('mail.send', 'default')")  # not dead

    groups = {(g["kind"], g["fingerprint"]): g for g in admin.dead_letter_groups(conn)}
    assert set(groups) == {
        ("mail.send", "KeyError: user <id> at <hex> missing"),
        ("mail.send", "TimeoutError: after <n> seconds"),
        ("bill.charge", "TimeoutError: after <n> seconds"),
    }
    biggest = admin.dead_letter_groups(conn)[0]
    assert (biggest["kind"], biggest["count"], biggest["sample_id"]) == ("mail.send", 2, newest)
    assert biggest["sample_traceback"].startswith(f"Traceback: KeyError: user {UUID_B}")
    assert biggest["first_seen"] <= biggest["last_seen"]


def test_fingerprint_normalises_whole_numbers_and_ids_never_digits_inside_words(conn):
    def fingerprint(error: str) -> str:
        return conn.execute("SELECT dygo_error_fingerprint(%s)", (error,)).fetchone()[0]

    for kept in (
        "Abort: e2e says no",
        "Http2Error: stream reset",
        "S3 upload refused",
        "IPv4 only",
        "OAuth2 token expired",
        "utf8 decode failed",
    ):
        assert fingerprint(kept) == kept
    assert (
        fingerprint("order 123 failed after 30s (id=42, 7 left; -1)")
        == "order <n> failed after <n>s (id=<n>, <n> left; -<n>)"
    )
    assert fingerprint(f"user {UUID_A} at 0x7f3a12") == "user <id> at <hex>"
    assert fingerprint("Abort: e2e says no, 3 times") == fingerprint("Abort: e2e says no, 4 times")


def test_retry_a_group_revives_only_that_group_and_respects_idempotency_keys(conn):
    first = dead(conn, "mail.send", "TimeoutError: after 30 seconds")
    second = dead(conn, "mail.send", "TimeoutError: after 31 seconds", key="k1")
    older_same_key = dead(conn, "mail.send", "TimeoutError: after 32 seconds", key="k1")
    held = dead(conn, "mail.send", "TimeoutError: after 33 seconds", key="k2")
    conn.execute("INSERT INTO dygo_jobs (kind, queue, idempotency_key) VALUES ('mail.send', 'default', 'k2')")
    other_kind = dead(conn, "bill.charge", "TimeoutError: after 30 seconds")

    assert admin.retry_dead_group(conn, "mail.send", "TimeoutError: after <n> seconds") == 2
    states = dict(conn.execute("SELECT id, state FROM dygo_jobs").fetchall())
    assert states[first] == "pending"
    assert {states[second], states[older_same_key]} == {"pending", "dead"}  # one revival per key
    assert states[held] == "dead" and states[other_kind] == "dead"
    assert admin.retry_dead_group(conn, "mail.send", "no such error") == 0


def test_bulk_actions_change_only_allowed_states_and_report_the_skipped(conn, monkeypatch):
    plain = dead(conn, "mail.send", "TimeoutError: x")
    keyed = dead(conn, "mail.send", "TimeoutError: y", key="k1")
    held = dead(conn, "mail.send", "TimeoutError: z", key="k2")
    conn.execute("INSERT INTO dygo_jobs (kind, queue, idempotency_key) VALUES ('mail.send', 'default', 'k2')")
    due, later = (
        conn.execute(
            "INSERT INTO dygo_jobs (kind, queue, run_at) VALUES ('bill.charge', 'default', "
            f"now() + interval '{offset}') RETURNING id"
        ).fetchone()[0]
        for offset in ("-1 minute", "1 hour")
    )

    # Ticked rows: the live key keeps `held` dead, and the pending job is skipped, not an error.
    report = admin.bulk_act(conn, "retry", ids=[plain, keyed, held, due])
    assert (report.matched, report.changed, report.skipped) == (4, 2, 2)
    states = dict(conn.execute("SELECT id, state FROM dygo_jobs").fetchall())
    assert (states[plain], states[keyed], states[held], states[due]) == ("pending", "pending", "dead", "pending")

    # A filter composes like the list: scheduled is pending with run_at ahead.
    where = admin.JobFilter(kind="bill.charge", state="scheduled")
    assert admin.count_matching(conn, "archive", where) == (1, 1, False)
    assert admin.bulk_act(conn, "archive", where=where) == admin.BulkReport(1, 1)
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (later,)).fetchone()[0] == "dead"
    assert conn.execute("SELECT sum(dead) FROM dygo_stats_deltas WHERE kind = 'bill.charge'").fetchone()[0] == 1

    # Bounded: more matches than the limit take the oldest ids, and the count says there are more.
    monkeypatch.setattr(admin, "BULK_LIMIT", 2)
    everything = admin.JobFilter()
    assert admin.count_matching(conn, "delete", everything) == (2, 2, True)
    assert admin.bulk_act(conn, "delete", where=everything) == admin.BulkReport(2, 2)
    assert conn.execute("SELECT count(*) FROM dygo_jobs WHERE id IN (%s, %s)", (plain, keyed)).fetchone()[0] == 0


def test_queue_lag_and_failing_kinds(conn):
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, run_at) VALUES ('a', 'default', now() - interval '90 seconds'),"
        " ('a', 'default', now() - interval '10 seconds'), ('a', 'other', now() + interval '1 hour')"
    )
    lag = admin.queue_lag(conn)
    assert set(lag) == {"default"} and 90 <= lag["default"] < 120
    conn.execute(
        "INSERT INTO dygo_daily_stats (day, queue, kind, failed, dead) VALUES "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'a', 3, 1), "
        "((now() AT TIME ZONE 'UTC')::date - 5, 'default', 'old', 50, 50)"
    )
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, failed, dead) VALUES "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'a', 1, 1), "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'b', 7, 0)"
    )
    assert admin.failing_kinds(conn) == [{"kind": "a", "dead": 2, "failed": 4}, {"kind": "b", "dead": 0, "failed": 7}]
