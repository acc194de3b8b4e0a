"""Slow clients against a real `dygo serve`: requests whose headers or body never finish are closed after
their timeouts, connections are capped below the process's file-descriptor limit, and neither takes the
service down nor floods the log."""

from __future__ import annotations

import contextlib
import resource
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, TEST_CONFIG, Api, DygoProcess, dygo_env, free_port

pytestmark = pytest.mark.alone

HALF_SENT = 3000  # connections, three times the descriptors serve is given
SERVE_FILES = 1024  # serve's RLIMIT_NOFILE: a common default, which the half-sent requests far exceed
HEADER_TIMEOUT = 5  # seconds
HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # the headers never end


def config_dir(tmp_path: Path, extra: str) -> Path:
    shutil.copy(TEST_CONFIG / "queues.yml", tmp_path / "queues.yml")
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + extra)
    return tmp_path


@contextlib.contextmanager
def file_limit(soft: int) -> Iterator[None]:
    """Processes started inside get `soft` as their RLIMIT_NOFILE (children inherit it)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, before[1]), before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.fixture
def slow_serve(db_url: str, tmp_path: Path) -> Iterator[Api]:
    """`dygo serve` with a short header timeout and 1024 file descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < HALF_SENT + 200:
        pytest.skip(f"this test needs {HALF_SENT + 200} file descriptors (ulimit -Hn)")
    port = free_port()
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config_dir(tmp_path, f"serve_header_timeout: {HEADER_TIMEOUT}s\n")))
    with file_limit(SERVE_FILES):
        process = DygoProcess(db_url, "serve", "--port", str(port), env=env)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HALF_SENT + 200), hard))  # for the test's sockets
        process.wait_for_line("dygo serve: auth")
        api = Api(process, port)
        api.wait_until_healthy()
        yield api
        api.close()
    finally:
        process.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_half_sent(port: int, count: int) -> list[socket.socket]:
    """`count` connections, each with a request whose headers never end; those serve does not accept are
    left out."""
    opened: list[socket.socket] = []
    for _ in range(count):
        raw = socket.socket()
        raw.settimeout(2)
        try:
            raw.connect(("127.0.0.1", port))
            raw.sendall(HALF_REQUEST)
        except OSError:
            raw.close()
            continue
        opened.append(raw)
    return opened


def closed_by_server(raw: socket.socket) -> bool:
    raw.setblocking(False)
    try:
        return raw.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_thousands_of_half_sent_requests_leave_healthz_answering_and_are_closed_after_the_timeout(slow_serve):
    api = slow_serve
    port = int(api.url.rsplit(":", 1)[1])
    half_sent = open_half_sent(port, HALF_SENT)
    opened = time.monotonic()
    try:
        assert len(half_sent) >= HALF_SENT // 2, f"only {len(half_sent)} connections opened"
        # While hundreds of them are still open, health checks answer, at once.
        for _ in range(5):
            asked = time.monotonic()
            reply = httpx.get(f"{api.url}/healthz", timeout=1.0)
            assert reply.status_code == 200 and time.monotonic() - asked < 1.0
        assert time.monotonic() - opened < HEADER_TIMEOUT - 1
        open_now = [raw for raw in half_sent if not closed_by_server(raw)]
        assert len(open_now) >= 100, f"only {len(open_now)} half-sent requests open"
        # After the header timeout, every half-sent request has been closed by serve.
        time.sleep(max(0.0, opened + HEADER_TIMEOUT + 1.5 - time.monotonic()))
        still_open = [raw for raw in half_sent if not closed_by_server(raw)]
        assert not still_open, f"{len(still_open)} of {len(half_sent)} half-sent requests still open"
    finally:
        for raw in half_sent:
            raw.close()
    assert httpx.get(f"{api.url}/healthz", timeout=1.0).status_code == 200
    api.process.signal(2)
    api.process.wait()
    logs = api.process.stderr()
    assert len(logs.splitlines()) < 50, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


def test_a_body_that_stops_arriving_is_closed_after_the_body_timeout(serve, tmp_path):
    api = serve(DYGO_CONFIG_DIR=str(config_dir(tmp_path, "serve_header_timeout: 2s\nserve_body_timeout: 2s\n")))
    port = int(api.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(
            b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + ADMIN_TOKEN.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"kind": '
        )
        sent = time.monotonic()
        while time.monotonic() - sent < 1.5:  # trickling keeps it no longer alive
            raw.sendall(b" ")
            time.sleep(0.3)
        reply = raw.recv(4096)
        waited = time.monotonic() - sent
    assert reply in (b"", b"\r\n") or reply.startswith(b"HTTP/1.1 4"), reply
    assert 1.5 <= waited < 4, waited
    # Headers that never end are closed after the header timeout, even when they trickle in.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        opened = time.monotonic()
        with contextlib.suppress(OSError):
            while time.monotonic() - opened < 5:
                raw.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.3)
        assert time.monotonic() - opened < 3
    assert api.anon.get("/healthz").status_code == 200
    api.process.signal(2)
    api.process.wait()
    assert "Traceback" not in api.process.stderr(), api.process.stderr()[-3000:]
