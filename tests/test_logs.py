"""Log lines: text in development, one JSON object per line in production (or --log-format json)."""

from __future__ import annotations

import json
import signal

from dygo.store import enqueue
from dygo.store.enqueue import JobRequest, enqueue_many

from tests.conftest import dygo_env, wait_until

EXECUTION_FIELDS = {"ts", "level", "logger", "message", "job_id", "kind", "queue", "attempt", "outcome", "duration_ms"}


def finished(conn, *ids: int) -> bool:
    states = conn.execute("SELECT state FROM dygo_jobs WHERE id = ANY(%s)", (list(ids),)).fetchall()
    return all(state in ("succeeded", "dead") for (state,) in states)


def test_production_worker_writes_one_json_object_per_line_with_the_execution_fields(conn, db_url, spawn):
    worker = spawn("worker", "--env", "production", env=dygo_env(db_url))
    worker.wait_for_line("started")
    ok = enqueue(conn, "test.record", {})
    dead = enqueue(conn, "test.abort", {})
    wait_until(lambda: finished(conn, ok.id, dead.id), message="both jobs to finish")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0

    lines = [json.loads(line) for line in worker.stderr().splitlines()]  # each line parses on its own
    executions = {line["job_id"]: line for line in lines if "job_id" in line}
    assert executions[ok.id].keys() >= EXECUTION_FIELDS
    assert executions[ok.id]["outcome"] == "succeeded" and executions[ok.id]["kind"] == "test.record"
    assert (executions[ok.id]["queue"], executions[ok.id]["attempt"]) == ("default", 1)
    assert isinstance(executions[ok.id]["duration_ms"], float) and executions[ok.id]["level"] == "INFO"
    assert executions[dead.id]["outcome"] == "dead" and executions[dead.id]["level"] == "WARNING"
    assert "never retry" in executions[dead.id]["error"]

    lifecycle = [json.loads(line) for line in worker.lines]  # stdout too
    assert [line["event"] for line in lifecycle] == ["started", "ready", "stopping", "stopped"]
    assert lifecycle[0]["queues"] == {"default": 8, "other": 2}


def test_jobs_that_finish_together_get_a_line_each_in_both_formats(conn, db_url, spawn):
    # --once runs one claimed batch: the no-op jobs end in the same turns of the event loop, so their
    # INFO lines share records (worker/execution_log.py), which must still print one line per job.
    for log_format in ("text", "json"):
        ids = [job.id for job in enqueue_many(conn, [JobRequest("test.noop", {})] * 8)]
        worker = spawn("worker", "--log-format", log_format, "--once", env=dygo_env(db_url))
        assert worker.wait() == 0
        lines = worker.stderr().splitlines()
        for job_id in ids:
            mine = [line for line in lines if f"job {job_id} test.noop attempt 1/" in line]
            assert len(mine) == 1, (log_format, job_id, lines)
            if log_format == "json":
                assert json.loads(mine[0])["job_id"] == job_id
            else:
                assert mine[0].split(" INFO dygo.worker: ")[1].startswith(f"job {job_id} ")


def test_log_format_flag_overrides_the_environment_default(conn, db_url, spawn):
    job = enqueue(conn, "test.record", {})
    text = spawn("worker", "--env", "production", "--log-format", "text", "--once", env=dygo_env(db_url))
    assert text.wait() == 0
    assert f"job {job.id} test.record attempt 1/20 succeeded" in text.stderr()
    assert not text.stderr().lstrip().startswith("{")

    job = enqueue(conn, "test.record", {})
    as_json = spawn("worker", "--log-format", "json", "--once", env=dygo_env(db_url))
    assert as_json.wait() == 0
    lines = [json.loads(line) for line in as_json.stderr().splitlines()]
    assert any(line.get("job_id") == job.id for line in lines)


def test_production_serve_logs_json_lines(conn, serve):
    api = serve("--env", "production")
    assert api.admin.get("/api/v1/queues").status_code == 200
    api.process.signal(signal.SIGTERM)
    api.process.wait()
    lines = [json.loads(line) for line in api.process.stderr().splitlines()]
    assert any("GET /api/v1/queues" in line["message"] for line in lines)  # uvicorn's access log
    started = [json.loads(line) for line in api.process.lines]
    assert [line["event"] for line in started[:3]] == ["listening", "hosts", "auth"]


def test_serve_stopped_by_sigterm_exits_0_and_still_writes_its_buffered_last_lines(conn, serve):
    api = serve()
    assert api.admin.get("/api/v1/queues").status_code == 200
    api.process.signal(signal.SIGTERM)  # at once: the access line is still in the 0.2 s buffer
    assert api.process.wait() == 0  # a graceful stop, not a crash (-15) for the process manager
    stderr = api.process.stderr()
    assert '"GET /api/v1/queues HTTP/1.1" 200' in stderr
    assert "Application shutdown complete." in stderr and "Finished server process" in stderr


def test_lifecycle_lines_are_printed_whatever_the_log_level(conn, db_url, spawn):
    # stdout lifecycle output is not a log: DYGO_LOG_LEVEL=WARNING quiets stderr, never these lines.
    quiet = dygo_env(db_url, DYGO_LOG_LEVEL="WARNING")
    worker = spawn("worker", env=quiet)
    worker.wait_for_line("started")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert any("stopped" in line for line in worker.lines)
    once = spawn("worker", "--once", env=quiet)
    assert once.wait() == 0
    assert any("ran 0 job(s) once" in line for line in once.lines)
    serve = spawn("serve", "--port", "0", env=quiet)
    serve.wait_for_line("dygo serve: http://")
    serve.wait_for_line("dygo serve: auth")


def test_every_control_character_is_escaped_and_printable_text_is_kept_as_it_is():
    from dygo.logs import CONTROL_ESCAPES, escape_controls

    plain = "job 12 email.send attempt 1/5 failed in 2ms, retry in 1.2s: ValueError: café ≠ 💥"
    assert escape_controls(plain) is plain
    for code, escaped in CONTROL_ESCAPES.items():
        assert escape_controls(f"a{chr(code)}b") == f"a{escaped}b"


def test_lines_that_share_a_record_each_get_the_prefix_and_their_own_escapes():
    import logging

    from dygo.logs import FORMAT, TextFormatter

    record = logging.LogRecord("dygo.worker", logging.INFO, __file__, 1, "ignored", None, None)
    record.lines = [("job 1 a.b attempt 1/3 succeeded in 1ms", dict), ("job 2 a.b\nforged", dict)]
    formatted = TextFormatter(FORMAT).format(record).split("\n")
    prefix = formatted[0].split("job 1 ")[0]
    assert prefix.endswith(" INFO dygo.worker: ")
    assert formatted == [prefix + "job 1 a.b attempt 1/3 succeeded in 1ms", prefix + "job 2 a.b\\nforged"]
