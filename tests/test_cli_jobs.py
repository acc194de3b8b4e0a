"""`dygo jobs list|show|retry|cancel` as real subprocesses against a real database."""

from __future__ import annotations

import re
import subprocess
import sys

from dygo.store import enqueue

from tests.conftest import REPO, dygo_env


def dygo(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dygo", *args],
        cwd=REPO,
        env=dygo_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_jobs_list_shows_a_filtered_table(conn, db_url):
    mine = enqueue(conn, "test.record", {}, queue="other")
    enqueue(conn, "test.record", {})
    later = enqueue(conn, "test.noop", {}, delay="1h")
    listed = dygo(db_url, "jobs", "list", "--queue", "other")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "KIND", "QUEUE", "STATE"]
    assert len(lines) == 2 and lines[1].split()[:5] == [str(mine.id), "test.record", "other", "pending", "0/-"]

    scheduled = dygo(db_url, "jobs", "list", "--state", "scheduled", "--kind", "test.noop", "--limit", "5")
    assert [line.split()[0] for line in scheduled.stdout.splitlines()[1:]] == [str(later.id)]
    assert dygo(db_url, "jobs", "list", "--state", "dead").stdout.strip() == "no jobs match"


def test_jobs_list_leaves_last_error_empty_for_a_job_that_failed_then_succeeded(conn, db_url):
    recovered = enqueue(conn, "test.fail", {"times": 1})  # attempt 1 fails, attempt 2 succeeds
    dead = enqueue(conn, "test.abort", {})
    assert dygo(db_url, "worker", "--once").returncode == 0  # the first attempt of each
    conn.execute("UPDATE dygo_jobs SET run_at = now() WHERE id = %s", (recovered.id,))  # skip the backoff
    assert dygo(db_url, "worker", "--once").returncode == 0
    state, last_error = conn.execute(
        "SELECT state, last_error FROM dygo_jobs WHERE id = %s", (recovered.id,)
    ).fetchone()
    assert state == "succeeded" and last_error == "ValueError: failure number 1"  # the history stays

    listed = dygo(db_url, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert rows[str(recovered.id)].split()[3] == "succeeded"
    assert "failure number" not in rows[str(recovered.id)]
    assert re.search(r"\d\d:\d\d:\d\d$", rows[str(recovered.id)].rstrip())  # FINISHED is the last column shown
    assert "Abort: bad input, never retry" in rows[str(dead.id)]  # an unsuccessful job still shows its error
    shown = dygo(db_url, "jobs", "show", str(recovered.id))
    assert "attempt 1 failed at " in shown.stdout and "ValueError: failure number 1" in shown.stdout


def test_jobs_show_prints_the_job_and_exits_1_for_an_unknown_id(conn, db_url):
    job = enqueue(conn, "test.record", {"seconds": 0.5}, meta={"tenant": "acme"})
    shown = dygo(db_url, "jobs", "show", str(job.id))
    assert shown.returncode == 0, shown.stderr
    assert "test.record" in shown.stdout and '{"tenant": "acme"}' in shown.stdout
    assert '{"seconds": 0.5}' in shown.stdout and "pending" in shown.stdout
    missing = dygo(db_url, "jobs", "show", "999999")
    assert missing.returncode == 1 and "no job with id 999999" in missing.stderr


def test_jobs_show_prints_each_failed_attempt_with_its_time_like_the_other_times(conn, db_url):
    job = enqueue(conn, "test.abort", {})
    ran = dygo(db_url, "worker", "--once", "--queue", "default")
    assert ran.returncode == 0, ran.stderr
    shown = dygo(db_url, "jobs", "show", str(job.id))
    assert shown.returncode == 0, shown.stderr
    failed = next(line for line in shown.stdout.splitlines() if line.startswith("attempt 1 failed at "))
    assert re.fullmatch(r"attempt 1 failed at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d on \S+: Abort: .+", failed), failed


def test_jobs_cancel_and_retry_act_on_each_id_and_exit_1_with_the_reason_for_the_rest(conn, db_url):
    first, second = enqueue(conn, "test.record", {}), enqueue(conn, "test.record", {})
    cancelled = dygo(db_url, "jobs", "cancel", str(first.id), str(second.id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"job {first.id}: cancelled, now cancelled" in cancelled.stdout
    states = conn.execute("SELECT array_agg(DISTINCT state) FROM dygo_jobs").fetchone()[0]
    assert states == ["cancelled"]

    again = dygo(db_url, "jobs", "cancel", str(first.id), "999999")
    assert again.returncode == 1
    assert (
        f"job {first.id} is cancelled; cancel applies to a job that is pending or scheduled or paused" in again.stderr
    )
    assert "no job with id 999999" in again.stderr

    retried = dygo(db_url, "jobs", "retry", str(first.id))
    assert retried.returncode == 0 and f"job {first.id}: retried, now pending" in retried.stdout
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (first.id,)).fetchone()[0] == "pending"


def test_jobs_usage_errors_exit_2(db_url):
    assert dygo(db_url, "jobs").returncode == 2
    assert dygo(db_url, "jobs", "retry").returncode == 2
    assert dygo(db_url, "jobs", "show", "abc").returncode == 2
    assert dygo(db_url, "jobs", "list", "--state", "sleeping").returncode == 2


def test_jobs_steps_lists_the_steps_and_retry_from_forgets_from_a_step(conn, db_url, spawn):
    job = enqueue(conn, "test.steps_abc", {})
    assert spawn("worker", "--once").wait() == 0
    listed = dygo(db_url, "jobs", "steps", str(job.id))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["SEQ", "KEY", "OP", "ATTEMPT", "RECORDED", "DURATION", "RESULT"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["1", "a#1", "step", "1"],
        ["2", "b#1", "step", "1"],
        ["3", "c#1", "step", "1"],
    ]

    retried = dygo(db_url, "jobs", "retry-from", str(job.id), "b#1")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"job {job.id}: forgot b#1, c#1; it is now pending"
    missing = dygo(db_url, "jobs", "retry-from", str(job.id), "b#1")
    assert missing.returncode == 1 and f"job {job.id} has no recorded step 'b#1'" in missing.stderr
    unknown = dygo(db_url, "jobs", "steps", "987654")
    assert unknown.returncode == 1 and "no job with id 987654" in unknown.stderr


def test_the_cli_escapes_control_characters_from_the_database_before_the_terminal_sees_them(conn, db_url):
    hostile = "boom\x1b[2J\x1b]0;owned\x07\rspoof\u2028\x9b"
    job = enqueue(conn, "test.noop", {}, queue="other")
    conn.execute(
        "UPDATE dygo_jobs SET state = 'dead', last_error = %s, errors = jsonb_build_array(jsonb_build_object("
        "'attempt', 1, 'at', now(), 'worker', %s::text, 'error', %s::text, 'traceback', %s::text)) WHERE id = %s",
        (hostile, hostile, hostile, f"Traceback\n  line {hostile}\n", job.id),
    )
    outputs = [
        dygo(db_url, "jobs", "list", "--queue", "other"),
        dygo(db_url, "jobs", "show", str(job.id)),
        dygo(db_url, "status"),
    ]
    for output in outputs:
        assert output.returncode == 0, output.stderr
        for control in ("\x1b", "\x07", "\r", "\u2028", "\x9b"):
            assert control not in output.stdout + output.stderr
    shown = outputs[1].stdout
    assert "boom\\x1b[2J\\x1b]0;owned\\x07\\rspoof\\u2028\\x9b" in shown
    assert "Traceback\n" in shown  # a traceback keeps its lines
