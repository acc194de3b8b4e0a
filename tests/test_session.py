"""The dashboard's signed cookies (app/session.py): a session reads back as it was written, and nothing
altered, expired, signed under another key or signed for another use is taken."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from dygo.app.session import Session, Signer

KEY = b"k" * 32


def test_a_session_cookie_reads_back_as_the_session_it_was_written_from():
    signer = Signer(KEY)
    for session in (Session.new(), Session.new("read"), Session.new("admin", token="fingerprint")):
        assert Session.read(signer, session.dump(signer)) == session
    assert Session.read(Signer(KEY), Session.new("admin").dump(signer)) is not None  # same key, another process


def test_an_altered_cookie_is_refused():
    signer = Signer(KEY)
    session = Session.new("read")
    cookie = session.dump(signer)
    payload, _, signature = cookie.rpartition(".")
    forged = signer.dumps({"sid": session.sid, "role": "admin", "exp": session.expires}).rpartition(".")[0]
    assert Session.read(signer, f"{forged}.{signature}") is None  # role swapped, old signature
    # The first character: the last one of unpadded base64 carries unused bits, so changing it may decode to
    # the same signature.
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert Session.read(signer, f"{payload}.{flipped}") is None
    for broken in ("", ".", cookie + "x", payload, "no-dot-at-all", "%%%.%%%"):
        assert Session.read(signer, broken) is None, broken
    assert Session.read(signer, None) is None


def test_a_cookie_signed_under_another_key_is_refused():
    cookie = Session.new("admin").dump(Signer(KEY))
    assert Session.read(Signer(b"x" * 32), cookie) is None


def test_an_expired_session_is_refused():
    signer = Signer(KEY)
    assert Session.read(signer, signer.dumps({"sid": "s", "role": "admin", "exp": time.time() - 1})) is None
    assert Session.read(signer, signer.dumps({"sid": "s", "role": "admin", "exp": time.time() + 60})) is not None


def test_a_signed_value_that_is_not_a_session_is_refused():
    signer = Signer(KEY)
    flash = signer.dumps({"message": "Retried", "level": "ok"})  # the flash cookie, same key
    assert signer.loads(flash) == {"message": "Retried", "level": "ok"}
    assert Session.read(signer, flash) is None
    assert signer.loads(signer._cookies.dumps(["sid"])) is None  # signed, but not an object
    # A CSRF token is a signature for another use (its own salt): never a valid cookie signature.
    session = Session.new("admin")
    payload = signer.dumps({"sid": session.sid, "role": "admin", "exp": session.expires}).rpartition(".")[0]
    assert Session.read(signer, f"{payload}.{signer.csrf_token(payload)}") is None


def test_the_csrf_token_belongs_to_one_session_and_one_key():
    signer = Signer(KEY)
    assert signer.csrf_token("a") == Signer(KEY).csrf_token("a")
    assert signer.csrf_token("a") != signer.csrf_token("b")
    assert signer.csrf_token("a") != Signer(b"x" * 32).csrf_token("a")


def test_a_cookie_of_the_earlier_hand_signed_format_signs_the_operator_out():
    """Cookies were base64 JSON plus a bare HMAC-SHA256 before itsdangerous signed them: such a cookie,
    even under the same key, is refused (its holder signs in again), never read."""
    session = {"sid": "s", "role": "admin", "exp": time.time() + 3600, "tk": None}
    data = base64.urlsafe_b64encode(json.dumps(session, separators=(",", ":")).encode()).decode().rstrip("=")
    mac = base64.urlsafe_b64encode(hmac.new(KEY, data.encode(), hashlib.sha256).digest()).decode().rstrip("=")
    assert Session.read(Signer(KEY), f"{data}.{mac}") is None
