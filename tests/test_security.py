"""The attacks `dygo serve` must withstand, each against real `dygo serve` processes.

Cross-site requests and foreign Host headers, security headers, server-side session revocation, the
shared bearer-token throttle and weak tokens, log forging, secrets in the access log, client protocol
errors, relative redirects, and the dashboard's own error page for a value PostgreSQL refuses.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import time

import httpx
import pytest
from dygo.app.throttle import LOGIN_ATTEMPTS

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, dygo_env, wait_until

CROSS_SITE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}


def _port(api) -> int:
    return int(api.url.rsplit(":", 1)[1])


def queue_paused(api, name: str) -> bool:
    queues = api.admin.get("/api/v1/queues").json()["queues"]
    return next(q for q in queues if q["name"] == name)["paused"]


# --- 1. cross-site requests and DNS rebinding ------------------------------------------------------


def test_cross_site_form_post_is_refused(serve):
    api = serve(tokens=False)  # development on localhost: no token to stop a forged request
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for headers in (
        {"Origin": "http://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},
    ):
        reply = api.anon.post("/api/v1/queues/default/pause", headers={**form, **headers}, content=b"x=1")
        assert reply.status_code == 403, (headers, reply.text)
        assert reply.json()["error"]["code"] == "cross_site_request"
    assert not queue_paused(api, "default")
    reply = api.anon.post("/api/v1/nuke", headers=CROSS_SITE)
    assert reply.status_code == 403


def test_same_origin_and_non_browser_posts_are_let_through(serve):
    api = serve(tokens=False)
    assert api.anon.post("/api/v1/queues/default/pause").status_code == 200  # curl: no Origin at all
    same = {"Origin": api.url, "Sec-Fetch-Site": "same-origin"}
    assert api.anon.post("/api/v1/queues/default/resume", headers=same).status_code == 200
    # Reads stay readable from anywhere a browser lets a response be read (nowhere, cross-origin: no CORS).
    assert api.anon.get("/api/v1/queues", headers=CROSS_SITE).status_code == 200


def test_a_foreign_host_header_is_refused_in_every_mode(serve):
    for api in (serve(tokens=False), serve("--env", "production")):
        client = api.admin
        for host in ("rebind.example", "rebind.example:8000", "127.0.0.1.rebind.example", "[::1].evil"):
            reply = client.get("/api/v1/jobs", headers={"Host": host})
            assert reply.status_code == 400, (host, reply.text)
            assert reply.json()["error"]["code"] == "host_not_allowed"
            assert "allowed_hosts" in reply.json()["error"]["message"]
        for host in ("127.0.0.1", f"127.0.0.1:{_port(api)}", f"localhost:{_port(api)}", "localhost"):
            assert client.get("/api/v1/jobs", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_admit_a_configured_name(serve):
    api = serve(tokens=False, DYGO_ALLOWED_HOSTS="jobs.example.com, .internal.example")
    assert api.anon.get("/api/v1/jobs", headers={"Host": "jobs.example.com"}).status_code == 200
    assert api.anon.get("/api/v1/jobs", headers={"Host": "a.internal.example:443"}).status_code == 200
    assert api.anon.get("/api/v1/jobs", headers={"Host": "internal.example"}).status_code == 200
    assert api.anon.get("/api/v1/jobs", headers={"Host": "example.com"}).status_code == 400
    assert "allowed hosts: jobs.example.com, .internal.example" in "".join(api.process.lines)


# --- 2. security headers ---------------------------------------------------------------------------


def test_every_response_carries_the_security_headers(serve):
    api = serve()
    signed_in = httpx.Client(base_url=api.url, follow_redirects=False)
    cookie = log_in(signed_in, ADMIN_TOKEN)
    assert cookie
    for client, path in (
        (signed_in, "/dashboard/"),
        (signed_in, "/dashboard/jobs"),
        (api.admin, "/api/v1/queues"),
        (api.anon, "/api/v1/queues"),
        (api.reader, "/metrics"),
        (api.anon, "/docs"),
    ):
        reply = client.get(path)
        assert reply.headers["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in reply.headers["content-security-policy"], path
        assert reply.headers["x-content-type-options"] == "nosniff", path
        assert reply.headers["referrer-policy"] == "same-origin", path
    for path in ("/dashboard/", "/dashboard/jobs", "/dashboard/queues"):
        reply = signed_in.get(path)
        assert reply.status_code == 200
        assert reply.headers["cache-control"] == "no-store", path
        policy = reply.headers["content-security-policy"]
        assert (
            "default-src 'none'" in policy
            and "script-src 'self'" in policy
            and "unsafe-inline" not in policy.split("style-src-attr")[0]
        ), policy
    assert api.admin.get("/api/v1/queues").headers["cache-control"] == "no-store"
    assert api.reader.get("/metrics").headers["cache-control"] == "no-store"


# --- 3. logout and token rotation revoke the session -----------------------------------------------


def log_in(client: httpx.Client, token: str) -> str:
    """Sign in through the login form; the session cookie's value."""
    page = client.get("/dashboard/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    reply = client.post("/dashboard/login", data={"csrf": csrf, "token": token, "next": "/dashboard/"})
    assert reply.status_code == 303, reply.text
    return client.cookies["dygo_session"]


def signed_in_page(url: str, cookie: str) -> httpx.Response:
    with httpx.Client(base_url=url, follow_redirects=False, cookies={"dygo_session": cookie}) as client:
        return client.get("/dashboard/queues")


def test_a_session_cookie_copied_before_logout_is_dead_after_it_on_every_process(serve):
    first, second = serve(), serve()
    client = httpx.Client(base_url=first.url, follow_redirects=False)
    copied = log_in(client, ADMIN_TOKEN)
    assert signed_in_page(second.url, copied).status_code == 200  # one session, valid on both processes
    page = client.get("/dashboard/queues")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert client.post("/dashboard/logout", data={"csrf": csrf}).status_code == 303
    for api in (first, second):
        reply = signed_in_page(api.url, copied)
        assert reply.status_code == 303 and "/dashboard/login" in reply.headers["location"], api.url


def cookie_value(cookie: str) -> dict:
    """What a session cookie says, as anyone holding a copy can read it (it is signed, not encrypted)."""
    payload = cookie.rpartition(".")[0]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_a_copied_session_cookie_cannot_test_token_guesses_offline(serve):
    fingerprints = []
    for key in ("first-signing-key-" + "a1B2c3D4e5F6g7H8i9J0k", "second-signing-key-" + "Z9y8X7w6V5u4T3s2R1q0p"):
        api = serve(DYGO_SECRET_KEY=key)
        with httpx.Client(base_url=api.url) as client:
            fingerprints.append(cookie_value(log_in(client, ADMIN_TOKEN))["tk"])
    # Keyed by the signing key: the same token gives another fingerprint under another key, so a guess cannot
    # be checked against a copied cookie without the key.
    assert fingerprints[0] != fingerprints[1]
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).digest()
    for unkeyed in (
        hashlib.sha256(b"dygo-session-token\n" + digest).hexdigest(),
        hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest(),
        hashlib.sha256(digest).hexdigest(),
    ):
        assert fingerprints[0] not in unkeyed and fingerprints[1] not in unkeyed


def test_sessions_end_when_their_token_is_rotated_out_even_with_a_fixed_secret_key(serve):
    key = "a-fixed-secret-key-for-the-dashboard-0123456789"
    before = serve(DYGO_SECRET_KEY=key)
    admin_cookie = log_in(httpx.Client(base_url=before.url, follow_redirects=False), ADMIN_TOKEN)
    read_cookie = log_in(httpx.Client(base_url=before.url, follow_redirects=False), READ_TOKEN)
    assert signed_in_page(before.url, admin_cookie).status_code == 200
    rotated = serve(DYGO_SECRET_KEY=key, DYGO_ADMIN_TOKEN="a-brand-new-admin-token-0123456789")
    reply = signed_in_page(rotated.url, admin_cookie)
    assert reply.status_code == 303 and "/dashboard/login" in reply.headers["location"]
    assert signed_in_page(rotated.url, read_cookie).status_code == 200  # the read token was kept: so is its session


# --- 4. bearer-token guessing and weak tokens -------------------------------------------------------


def test_wrong_bearer_tokens_lock_a_client_out_across_serve_processes(serve):
    first, second = serve(), serve()
    guesser = {"X-Forwarded-For": "203.0.113.7"}  # uvicorn trusts X-Forwarded-For from 127.0.0.1
    for n in range(LOGIN_ATTEMPTS):
        api = (first, second)[n % 2]
        reply = api.anon.get("/api/v1/queues", headers={**guesser, "Authorization": f"Bearer wrong-guess-{n:020d}"})
        assert reply.status_code == (401 if n < LOGIN_ATTEMPTS - 1 else 429), reply.text
    for api in (first, second):
        reply = api.anon.get("/api/v1/queues", headers={**guesser, "Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert reply.status_code == 429, reply.text  # even the right token: guessing must not pay off
        assert reply.json()["error"]["code"] == "too_many_failures"
        assert 240 < int(reply.headers["retry-after"]) <= 300
    other = {"X-Forwarded-For": "203.0.113.8"}
    assert (
        first.anon.get("/api/v1/queues", headers={**other, "Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    )
    # The dashboard's sign-in counts the same failures: the guesser cannot switch to the login form.
    client = httpx.Client(base_url=second.url, follow_redirects=False, headers=guesser)
    page = client.get("/dashboard/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert client.post("/dashboard/login", data={"csrf": csrf, "token": ADMIN_TOKEN}).status_code == 429


@pytest.mark.parametrize(
    "token",
    [
        "aaaaaaaaaaaaaaaaaaaa",
        "passwordpassword",
        "0123456789abcdefghij",
        "abcabcabcabcabcabcabcabc",
        "Password123456789",
        "dygo-admin-token-production",
        "correcthorsebatterystaple",
        "Summer2024Summer2024!",
        "1qaz2wsx3edc4rfv5tgb",
        "correcthorsebatterystaplecorrecthorse",
        "abcdefghabcdefghabcdefghabcdefghabcdefgh",
    ],
)
def test_production_refuses_a_token_too_simple_to_be_random(spawn, db_url, token):
    process = spawn("serve", "--env", "production", env=dygo_env(db_url, DYGO_ADMIN_TOKEN=token))
    assert process.wait() == 2
    message = process.stderr()
    assert "DYGO_ADMIN_TOKEN" in message and "too simple" in message
    assert "python -c 'import secrets; print(secrets.token_urlsafe(32))'" in message
    assert token not in message


def test_production_refuses_a_signing_key_too_simple_to_be_random(spawn, db_url):
    process = spawn("serve", "--env", "production", env=dygo_env(db_url, DYGO_SECRET_KEY="a"))
    assert process.wait() == 2
    message = process.stderr()
    assert "DYGO_SECRET_KEY" in message and "too short or too simple" in message and "token_urlsafe(32)" in message


def test_production_accepts_generated_tokens(serve):
    import secrets

    api = serve(
        "--env",
        "production",
        DYGO_ADMIN_TOKEN=secrets.token_urlsafe(32),
        DYGO_READ_TOKEN=secrets.token_hex(32),
        DYGO_SECRET_KEY=secrets.token_urlsafe(32),
    )
    assert api.anon.get("/healthz").status_code == 200


# --- 5. log forging ----------------------------------------------------------------------------------


def test_text_logs_escape_control_characters_from_a_job(api, spawn):
    forged = "2026-01-01 00:00:00,000 INFO dygo.worker: job 1 test.noop attempt 1/1 succeeded in 1ms"
    job = api.admin.post(
        "/api/v1/jobs", json={"kind": "test.abort_with", "args": {"message": f"boom\n{forged}\r\x1b[2K\u2028{forged}"}}
    ).json()["id"]
    worker = spawn("worker", "--log-format", "text")
    wait_until(lambda: api.admin.get(f"/api/v1/jobs/{job}").json()["state"] == "dead", message="the job to die")
    worker.signal(2)
    worker.wait()
    lines = worker.stderr().splitlines()
    assert not [line for line in lines if line.startswith("2026-01-01")], lines
    dead = [line for line in lines if f"job {job} test.abort_with" in line]
    assert len(dead) == 1 and "boom\\n2026-01-01" in dead[0] and "\\x1b[2K" in dead[0] and "\\u2028" in dead[0]


# --- 6. secrets in the access log ---------------------------------------------------------------------


def test_a_token_in_the_query_string_is_redacted_from_the_access_log(serve):
    api = serve("--env", "production")
    secret = "query-string-secret-0123456789"
    api.anon.get("/api/v1/queues", params={"token": secret, "limit": "3"})
    api.anon.get("/dashboard/login", params={"access_token": secret, "api_key": secret, "next": "/dashboard/"})
    api.process.signal(2)
    api.process.wait()
    logs = api.process.stderr()
    assert "GET /api/v1/queues?token=***&limit=3" in logs
    assert "access_token=***&api_key=***&next=" in logs
    assert secret not in logs


def test_a_configured_token_anywhere_in_the_target_is_redacted_from_the_access_log(serve):
    api = serve()
    quoted = "".join(f"%{ord(c):02X}" for c in READ_TOKEN)  # every character percent-encoded
    targets = [
        f"/api/v1/queues?jwt={ADMIN_TOKEN}",
        f"/api/v1/queues?t={ADMIN_TOKEN}&limit=3",
        f"/api/v1/queues?pwd={READ_TOKEN}&pass={ADMIN_TOKEN}&credentials={READ_TOKEN}",
        f"/api/v1/queues?token[]={ADMIN_TOKEN}",
        f"/api/v1/queues?limit=3;token={ADMIN_TOKEN}",
        f"/api/v1/queues?x=Bearer%20{ADMIN_TOKEN}",
        f"/api/v1/jobs/{ADMIN_TOKEN}",
        f"/dashboard/{READ_TOKEN}/jobs",
        f"/api/v1/queues?q={quoted}",
        "/api/v1/queues?q=not-a-token-but-just-as-long-as-one-0123456789",
    ]
    with socket.create_connection(("127.0.0.1", _port(api)), timeout=5) as raw:
        for target in targets:  # raw, so that no client re-encodes the target
            raw.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            read_response(raw, see_if_closed=False)
    api.process.signal(2)
    api.process.wait()
    logs = api.process.stderr()
    assert ADMIN_TOKEN not in logs and READ_TOKEN not in logs and quoted not in logs, logs[-3000:]
    lines = [line for line in logs.splitlines() if "uvicorn.access" in line and "/healthz" not in line]
    assert len(lines) == len(targets), logs[-3000:]
    assert "GET /api/v1/queues?t=***&limit=3 " in logs and "GET /api/v1/jobs/*** " in logs, logs[-3000:]
    assert "/dashboard/***/jobs " in logs and "not-a-token-but-just-as-long-as-one-0123456789" in logs


# --- 8. client protocol errors ------------------------------------------------------------------------


def test_a_malformed_chunked_body_logs_one_line_without_a_traceback(serve):
    api = serve()
    requests = [  # unauthenticated: refused with 401 before the body is read, then the bad chunk arrives
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"kin\r\nzz-not-hex\r\nrest\r\n0\r\n\r\n',
        # authenticated: the app is reading the body when the bad chunk comes
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + ADMIN_TOKEN.encode()
        + b'\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"kin\r\n',
    ]
    for request in requests:
        with socket.create_connection(("127.0.0.1", _port(api)), timeout=5) as raw:
            raw.sendall(request)
            time.sleep(0.3)
            try:
                raw.sendall(b"zz-not-hex\r\nrest\r\n0\r\n\r\n")
                raw.recv(4096)
            except OSError:
                pass
    time.sleep(0.5)
    api.process.signal(2)
    api.process.wait()
    logs = api.process.stderr()
    assert "Traceback" not in logs and "ERROR" not in logs, logs[-3000:]
    refused = [line for line in logs.splitlines() if "invalid http request" in line.lower()]
    assert len(refused) == len(requests), logs[-3000:]


def test_a_bad_chunk_after_an_early_401_or_403_logs_one_line_without_a_traceback(serve):
    api = serve()
    chunked = b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
    heads = [
        chunked + b"\r\n",  # 401: no token
        chunked + b"Authorization: Bearer " + READ_TOKEN.encode() + b"\r\n\r\n",  # 403: a read token
        chunked + b"Origin: http://evil.example\r\n\r\n",  # 403: another site
    ]
    for head in heads:
        with socket.create_connection(("127.0.0.1", _port(api)), timeout=5) as raw:
            raw.sendall(head + b"5\r\nhello\r\n")
            assert raw.recv(4096).startswith((b"HTTP/1.1 401", b"HTTP/1.1 403"))  # the whole answer is out
            time.sleep(0.2)
            try:
                raw.sendall(b"zz-not-hex\r\nrest\r\n0\r\n\r\n")
                raw.recv(4096)
            except OSError:
                pass
    time.sleep(0.5)
    assert api.anon.get("/healthz").status_code == 200
    api.process.signal(2)
    api.process.wait()
    logs = api.process.stderr()
    assert "Traceback" not in logs and "ERROR" not in logs, logs[-3000:]
    refused = [line for line in logs.splitlines() if "invalid http request" in line.lower()]
    assert len(refused) <= len(heads), logs[-3000:]


def read_response(raw: socket.socket, *, see_if_closed: bool = True) -> tuple[bytes, bool]:
    """(the response's head, whether the server closed the connection after it: seen by waiting up to 2 s for
    more, unless `see_if_closed` is false)."""
    data = b""
    raw.settimeout(2)
    try:
        while b"\r\n\r\n" not in data:
            data += raw.recv(4096)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            body += raw.recv(4096)
        return head, see_if_closed and raw.recv(4096) == b""
    except TimeoutError:
        return data, False
    except ConnectionResetError:
        return data, True


def test_a_request_with_both_content_length_and_transfer_encoding_gets_its_connection_closed(serve):
    api = serve()
    body = b'{"kind": "test.noop"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    requests = [
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n",
    ]
    for request in requests:
        with socket.create_connection(("127.0.0.1", _port(api)), timeout=5) as raw:
            raw.sendall(request)
            head, closed = read_response(raw)
            assert head.startswith(b"HTTP/1.1 "), head
            assert closed, f"the connection stayed open after {head[:40]!r}"
            assert b"connection: close" in head.lower(), head
    # Either header alone keeps the connection alive as usual.
    with socket.create_connection(("127.0.0.1", _port(api)), timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
        head, closed = read_response(raw)
        assert head.startswith(b"HTTP/1.1 200") and not closed, head


# --- 10. relative redirects ----------------------------------------------------------------------------


def test_trailing_slash_redirects_are_relative(serve):
    api = serve(DYGO_ALLOWED_HOSTS="jobs.example.com")
    for path, target in (
        ("/metrics/", "/metrics"),
        ("/api/v1/queues/", "/api/v1/queues"),
        ("/api/v1/jobs/?limit=2", "/api/v1/jobs?limit=2"),
    ):
        reply = api.reader.get(path, headers={"Host": "jobs.example.com"}, follow_redirects=False)
        assert reply.status_code == 307, (path, reply.text)
        assert reply.headers["location"] == target


# --- 11. the dashboard's error page for values PostgreSQL refuses -------------------------------------


def test_a_nul_in_a_dashboard_filter_shows_the_dashboards_error_page(serve):
    api = serve(tokens=False)
    assert api.anon.post("/api/v1/jobs", json={"kind": "test.noop"}).status_code == 201  # so the list is searched
    for path in ("/dashboard/jobs?q=%00", "/dashboard/jobs?kind=a%00b", "/dashboard/bulk/delete/confirm?queue=%00"):
        reply = api.anon.get(path)
        assert reply.status_code == 422, (path, reply.text)
        assert reply.headers["content-type"].startswith("text/html"), path
        assert "<h1" in reply.text and "NUL" in reply.text and '"error":' not in reply.text, reply.text[:500]


def test_a_malformed_id_in_a_dashboard_path_shows_the_dashboards_error_page(serve):
    api = serve(tokens=False)
    for path in ("/dashboard/jobs/abc", "/dashboard/jobs/%00", "/dashboard/jobs/1.5", "/dashboard/workflows/x%0a"):
        reply = api.anon.get(path)
        assert reply.status_code == 404, (path, reply.text)
        assert reply.headers["content-type"].startswith("text/html"), (path, reply.text[:300])
        assert "<h1" in reply.text and '"detail"' not in reply.text, reply.text[:500]
    # The API keeps its JSON error.
    reply = api.anon.get("/api/v1/jobs/abc")
    assert reply.status_code == 422 and reply.json()["error"]["code"], reply.text
