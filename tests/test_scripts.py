"""The curl scripts in scripts/, run by /bin/sh against a real `dygo serve` with a token."""

from __future__ import annotations

import json
import os
import subprocess

from dygo.store import enqueue

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, REPO

SCRIPTS = REPO / "scripts"


def run(api, *args: str, token: str | None = ADMIN_TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_")}
    env["DYGO_URL"] = api.url
    if token:
        env["DYGO_TOKEN"] = token
    return subprocess.run(
        ["/bin/sh", str(SCRIPTS / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=30
    )


def reply(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads(result.stdout)


def test_scripts_are_executable():
    for name in ("enqueue", "run-now", "retry", "retry-all-dead", "purge"):
        assert os.access(SCRIPTS / name, os.X_OK), name


def test_enqueue_then_run_now(api, conn):
    job = reply(run(api, "enqueue", "test.record", '{"seconds": 2}', '{"delay": "1h", "priority": 4}'))
    stored = conn.execute(
        "SELECT kind, args, priority, run_at > now() FROM dygo_jobs WHERE id = %s", (job["id"],)
    ).fetchone()
    assert stored == ("test.record", {"seconds": 2}, 4, True)
    assert reply(run(api, "run-now", str(job["id"])))["state"] == "pending"
    refused = run(api, "run-now", str(job["id"]))  # no longer scheduled
    assert refused.returncode == 1 and "HTTP 409" in refused.stderr
    assert json.loads(refused.stdout)["error"]["code"] == "invalid_transition"
    assert reply(run(api, "enqueue", "test.noop"))["deduplicated"] is False


def test_retry_and_retry_all_dead(api, conn):
    ids = [enqueue(conn, "test.noop", {}).id for _ in range(3)]
    conn.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now()")
    assert reply(run(api, "retry", str(ids[0])))["state"] == "pending"
    assert reply(run(api, "retry-all-dead", "default")) == {"queue": "default", "retried": 2}


def test_retry_all_dead_of_every_queue(api, conn):
    ids = [enqueue(conn, "test.noop", {}).id, enqueue(conn, "test.record_sync", {}).id]  # default, other
    conn.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now()")
    assert reply(run(api, "retry-all-dead", "--all")) == {"queue": None, "retried": 2}
    states = conn.execute("SELECT state FROM dygo_jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    assert states == [("pending",), ("pending",)]
    assert run(api, "retry-all-dead").returncode == 2  # no queue and no --all: usage, nothing retried


def test_purge(api, conn):
    enqueue(conn, "test.noop", {})
    enqueue(conn, "test.noop", {}, delay="1h")
    report = reply(run(api, "purge", "default"))
    assert (report["pending"], report["scheduled"], report["dead"]) == (1, 1, 0)


def test_errors_and_bad_arguments_exit_non_zero(api):
    missing = run(api, "retry", "424242")
    assert missing.returncode == 1 and json.loads(missing.stdout)["error"]["code"] == "job_not_found"
    assert run(api, "purge", "default", token=None).returncode == 1  # 401: this server wants a token
    assert run(api, "purge", "default", token=READ_TOKEN).returncode == 1  # 403: read-only
    for args in (("run-now",), ("retry", "12; rm -rf /"), ("purge", "Not A Queue"), ("enqueue", 'a"b')):
        result = run(api, *args)
        assert result.returncode == 2 and result.stderr, args


def test_the_token_is_never_a_curl_argument():
    # Arguments show in `ps`; the token goes to curl on its stdin (-H @-) instead.
    helper = (SCRIPTS / "_dygo.sh").read_text()
    assert "-H @-" in helper and '-H "Authorization' not in helper
    for name in ("enqueue", "run-now", "retry", "retry-all-dead", "purge"):
        assert "curl" not in (SCRIPTS / name).read_text().replace("curl scripts", ""), name
