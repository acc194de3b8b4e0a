"""The overview's rollups without a browser: per-minute throughput, its trim, stored dead-letter
fingerprints and vacuum-dead counts."""

from __future__ import annotations

from dygo.store import admin, enqueue
from dygo.store.leases import Unsuccessful, recover_expired, settle
from dygo.store.maintenance import MINUTE_STATS_KEEP, RetentionPeriods

from tests.test_leases import aconnect, claim_now, run
from tests.test_retention import run_trim

KEEP_FOREVER = RetentionPeriods(succeeded=0, dead=0, cancelled=0, daily_stats=0)


def delta(conn, minutes_ago: int, succeeded: int = 0, failed: int = 0, dead: int = 0, kind: str = "a") -> None:
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded, failed, dead, at) "
        "VALUES ((now() AT TIME ZONE 'UTC')::date, 'default', %s, %s, %s, %s, "
        "date_trunc('minute', now()) - make_interval(mins => %s) + interval '1 second')",
        (kind, succeeded, failed, dead, minutes_ago),
    )


def by_minute(conn) -> list[tuple[int, int, int]]:
    return [(m["succeeded"], m["failed"], m["dead"]) for m in admin.minute_stats(conn, 60)]


def test_minute_throughput_reads_unfolded_deltas_and_the_same_after_the_fold(conn):
    delta(conn, 0, succeeded=3)
    delta(conn, 0, succeeded=2, failed=1, kind="b")  # another kind, same minute: summed
    delta(conn, 5, failed=4, dead=1)
    delta(conn, 90, succeeded=100)  # outside the hour
    before = by_minute(conn)
    assert len(before) == 60
    assert before[-1] == (5, 1, 0) and before[-6] == (0, 4, 1)
    assert sum(s for s, _, _ in before) == 5  # the delta from 90 minutes ago is not drawn
    assert admin.fold_stats(conn)
    assert conn.execute("SELECT count(*) FROM dygo_stats_deltas").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM dygo_minute_stats").fetchone()[0] == 4  # minute x kind
    assert by_minute(conn) == before
    assert admin.daily_stats(conn, None, 1)["totals"]["succeeded"] == 105  # the daily fold still happens


def test_retention_trims_minute_rollups_after_two_hours_whatever_the_retention(conn, db_url):
    for minutes_ago in (10, 119, int(MINUTE_STATS_KEEP // 60) + 5, 600):
        delta(conn, minutes_ago, succeeded=1)
    trimmed = run_trim(db_url, KEEP_FOREVER)  # the pass folds first, then trims
    assert trimmed.minute_stats == 2
    kept = conn.execute("SELECT count(*) FROM dygo_minute_stats").fetchone()[0]
    assert kept == 2


def test_every_way_to_die_stores_the_fingerprint_the_groups_read(conn):
    ids = [
        conn.execute("INSERT INTO dygo_jobs (kind, queue) VALUES ('a', 'default') RETURNING id").fetchone()[0]
        for _ in range(3)
    ]
    admin.act_on_job(conn, "archive", ids[0])
    assert admin.bulk_act(conn, "archive", ids=ids[1:]).changed == 2
    fingerprints = conn.execute("SELECT DISTINCT dead_fingerprint FROM dygo_jobs").fetchall()
    assert fingerprints == [("archived by an operator before it ran",)]
    [group] = admin.dead_letter_groups(conn)
    assert (group["kind"], group["count"], group["sample_id"]) == ("a", 3, ids[2])
    assert admin.retry_dead_group(conn, "a", group["fingerprint"]) == 3


def test_fingerprints_normalise_numbers_hex_and_uuids_in_the_first_line(conn):
    error = "KeyError: order 1234 at 0xDEADbeef for 0b1e2f7a-1c2d-4e5f-8a9b-0C1D2E3F4A5B\nTraceback 99"
    assert (
        conn.execute("SELECT dygo_error_fingerprint(%s)", (error,)).fetchone()[0]
        == "KeyError: order <n> at <hex> for <id>"
    )
    assert conn.execute("SELECT dygo_error_fingerprint(NULL)").fetchone()[0] == ""


def test_vacuum_dead_counts_what_it_then_deletes(conn):
    for age in ("3 days", "3 days", "1 hour"):
        conn.execute(
            "INSERT INTO dygo_jobs (kind, queue, state, finished_at) "
            "VALUES ('a', 'default', 'dead', now() - %s::interval)",
            (age,),
        )
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, finished_at) "
        "VALUES ('a', 'other', 'dead', now() - interval '3 days')"
    )
    assert admin.count_vacuum_dead(conn, "default", 86400) == 2
    assert admin.vacuum_dead(conn, "default", 86400) == 2
    assert admin.count_vacuum_dead(conn, "default", 0) == 1


def test_settling_and_poison_recovery_store_the_fingerprint_of_the_error_that_killed_the_job(conn, db_url):
    dies, retries, poisoned = (enqueue(conn, "test.noop", {}).id for _ in range(3))
    jobs = {job.id: job for job in claim_now(db_url, limit=2, owner="worker-7")}
    run(
        settle_now(
            db_url,
            [
                Unsuccessful(jobs[dies], "dead", error="ValueError: order 17 failed\nmore"),
                Unsuccessful(jobs[retries], "pending", delay=60, error="ValueError: order 18 failed"),
            ],
        )
    )
    [last] = claim_now(db_url, limit=1, owner="worker-7")
    conn.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1s' WHERE id = %s", (last.id,))
    run(recover_now(db_url, max_reaps=0))
    fingerprints = dict(conn.execute("SELECT id, dead_fingerprint FROM dygo_jobs").fetchall())
    assert fingerprints == {
        dies: "ValueError: order <n> failed",
        retries: None,
        poisoned: "lease expired: worker worker-<n> stopped renewing it",
    }
    assert {(g["fingerprint"], g["count"]) for g in admin.dead_letter_groups(conn)} == {
        ("ValueError: order <n> failed", 1),
        ("lease expired: worker worker-<n> stopped renewing it", 1),
    }


async def settle_now(url: str, outcomes: list) -> set[int]:
    async with await aconnect(url) as c:
        return await settle(c, outcomes)


async def recover_now(url: str, max_reaps: int) -> list:
    async with await aconnect(url) as c:
        return (await recover_expired(c, max_reaps=max_reaps)).jobs
