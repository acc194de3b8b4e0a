"""Secrets never reach logs, stderr or HTTP error bodies: database passwords and API tokens.

Real `dygo` processes are pointed at a closed port, at malformed URLs (libpq quotes the part it cannot
parse, which can be the password), and at a stand-in PostgreSQL server that asks for the password and
refuses it; real `dygo serve` answers requests carrying wrong tokens.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from dygo.store.db import redact, scrub

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, dygo_env, free_port

PASSWORD = "Pw-4f9c2e7d1b"


class RefusingServer:
    """Speaks just enough of the PostgreSQL protocol to ask for a cleartext password and refuse it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.passwords: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with client, contextlib.suppress(OSError):
                self._refuse(client)

    def _refuse(self, client: socket.socket) -> None:
        while True:  # SSL and GSS encryption requests get 'N'; then comes the startup packet
            length, code = struct.unpack("!ii", _read(client, 8))
            _read(client, length - 8)
            if code in (80877103, 80877104):
                client.sendall(b"N")
                continue
            break
        client.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        kind, length = struct.unpack("!ci", _read(client, 5))
        self.passwords.append(_read(client, length - 4).rstrip(b"\0"))
        fields = b'SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user "dygo"\0\0'
        client.sendall(b"E" + struct.pack("!i", len(fields) + 4) + fields)

    def close(self) -> None:
        self.listener.close()


def _read(client: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


@pytest.fixture
def refusing_server() -> Iterator[RefusingServer]:
    server = RefusingServer()
    yield server
    server.close()


def closed_port() -> int:
    return free_port()  # bound and released: nothing listens there


def run_briefly(spawn, url: str, *args: str, timeout: float = 20.0) -> tuple[int | None, str]:
    """Run `dygo *args` with DATABASE_URL=url until it exits or logs a connection error (the worker keeps
    retrying: it is killed then)."""
    process = spawn(*args, env=dygo_env(url, DYGO_ADMIN_TOKEN=ADMIN_TOKEN, DYGO_READ_TOKEN=READ_TOKEN))
    deadline = time.monotonic() + timeout
    while (
        time.monotonic() < deadline
        and process.process.poll() is None
        and "cannot reach the database" not in process.stderr()
    ):
        time.sleep(0.1)
    if "worker" not in args:  # it said so and is exiting: let it finish, to see its exit code
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.process.wait(10)
    code = process.process.poll()
    if code is None:
        process.process.kill()
        process.process.wait(10)
    assert process.process.stdout is not None
    stdout = process.process.stdout.read()
    process.stop()
    return code, stdout + process.stderr()


def url_id(url: str) -> str:
    return "closed port" if url.startswith(f"postgresql://dygo:{PASSWORD}@127.0.0.1:") else "malformed"


def assert_no_secret(output: str) -> None:
    assert PASSWORD not in output, output
    assert ADMIN_TOKEN not in output and READ_TOKEN not in output, output
    assert "Traceback" not in output, output


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://dygo:{PASSWORD}@127.0.0.1:{{port}}/dygo",
        # libpq: invalid percent-encoded token: "<password>"
        f"postgresql://dygo:{PASSWORD}%zz@127.0.0.1:{{port}}/dygo",
        f"postgresql://dygo:{PASSWORD}@[::1/dygo",  # libpq quotes the whole URI
        f"host=127.0.0.1 port={{port}} user=dygo password={PASSWORD} dbname",
        f"host=127.0.0.1 port={{port}} user=dygo password='{PASSWORD}",
        f"postgresql://dygo@127.0.0.1:{{port}}/dygo?password={PASSWORD}&sslmode=nonsense",
    ],
    ids=[
        "closed port",
        "bad percent escape",
        "bad IPv6 host",
        "bad key=value",
        "unterminated quote",
        "password in query",
    ],
)
def test_database_password_never_appears_when_the_database_is_unreachable_or_the_url_malformed(spawn, url):
    url = url.format(port=closed_port())
    commands = [("migrate",), ("worker",)]
    if "closed port" in url_id(url):  # every command reaches the database the same way; one case tries them all
        commands += [("status",), ("serve", "--port", str(free_port()))]
    for command in commands:
        code, output = run_briefly(spawn, url, *command)
        assert_no_secret(output)
        assert "dygo:" in output or "cannot reach the database" in output, output  # it said what went wrong
        if command != ("worker",):  # the worker keeps retrying a database that may come back
            assert code == 1, output


def test_database_password_never_appears_when_the_server_refuses_it(spawn, refusing_server):
    url = f"postgresql://dygo:{PASSWORD}@127.0.0.1:{refusing_server.port}/dygo?sslmode=disable"
    for command in (("migrate",), ("serve", "--port", str(free_port())), ("worker",)):
        code, output = run_briefly(spawn, url, *command)
        assert "password authentication failed" in output, output
        assert_no_secret(output)
    assert PASSWORD.encode() in refusing_server.passwords  # the password really was in play


def test_tokens_never_appear_in_error_bodies_or_the_serve_log(serve):
    api = serve()
    near_misses = [ADMIN_TOKEN + "x", ADMIN_TOKEN[:-1], READ_TOKEN.upper(), f"{ADMIN_TOKEN} {READ_TOKEN}"]
    for n, token in enumerate(near_misses):
        for m, (method, path) in enumerate(
            (("GET", "/api/v1/jobs"), ("POST", "/api/v1/queues/default/pause"), ("GET", "/metrics"))
        ):
            # A different (proxied) client address each: the failed-token throttle locks one out after 5.
            headers = {"Authorization": f"Bearer {token}", "X-Forwarded-For": f"198.51.100.{n * 3 + m + 1}"}
            response = api.anon.request(method, path, headers=headers)
            assert response.status_code == 401, response.text
            assert token not in response.text and ADMIN_TOKEN not in response.text and READ_TOKEN not in response.text
    refused = api.reader.post("/api/v1/queues/default/pause")
    assert refused.status_code == 403 and READ_TOKEN not in refused.text
    for scheme in (f"Basic {ADMIN_TOKEN}", ADMIN_TOKEN, f"Token {READ_TOKEN}"):
        response = api.anon.get("/api/v1/jobs", headers={"Authorization": scheme})
        assert response.status_code == 401 and ADMIN_TOKEN not in response.text and READ_TOKEN not in response.text
    api.process.stop()
    assert_no_secret("".join(api.process.lines) + api.process.stderr())


def test_scrub_hides_every_spelling_of_the_password():
    for url, message in [
        ("postgresql://u:p%40ss@h/d", 'token: "p%40ss" and p@ss'),
        ("host=h password='a b\\'c' user=u", "bad a b\\'c here"),
        ("host=h password=plain user=u", "saw plain"),
        ("postgresql://u@h/d?sslmode=x&password=q%20r", "q%20r q r"),
    ]:
        cleaned = scrub(message, url)
        assert "***" in cleaned
        for secret in ("p%40ss", "p@ss", "a b\\'c", "plain", "q%20r", "q r"):
            assert secret not in cleaned
    assert redact("postgresql://u:secret@h:5432/d") == "postgresql://u:***@h:5432/d"
