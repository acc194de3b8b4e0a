"""A real PgBouncer (Debian's 1.18) of the tests' own, in transaction pooling mode, in front of the test server.

Every database of the server is reachable through it under its own name (a `*` entry), so a test's
fresh database is too. As root, PgBouncer refuses to run unless told which user to become: the
embedded server's system user (it owns the folder holding the ini, log and pid files, and can reach
the server's socket). `make test` installs the package as root; without it the tests skip and say why.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BINARY = "/usr/sbin/pgbouncer"
RUN_AS = "embedded_postgres"  # the embedded server's user (store/embedded.py), when running as root


def missing_reason() -> str | None:
    """Why PgBouncer cannot run here, or None when it can."""
    if not os.path.exists(BINARY) and not shutil.which("pgbouncer"):
        return "pgbouncer is not installed (as root, `make test` installs Debian's package)"
    if os.getuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no {RUN_AS} user for pgbouncer to run as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    def __init__(self, server_url: str, workdir: Path) -> None:
        self.server = conninfo_to_dict(server_url)
        self.workdir = workdir
        self.port = free_port()
        self.binary = BINARY if os.path.exists(BINARY) else shutil.which("pgbouncer") or BINARY
        self.user = self.server.get("user") or "postgres"

    def url(self, direct_url: str) -> str:
        """The URL of `direct_url`'s database through this PgBouncer."""
        dbname = conninfo_to_dict(direct_url)["dbname"]
        return make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=self.user)

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        target = " ".join(
            f"{key}={value}"
            for key, value in self.server.items()
            if key in ("host", "port", "user", "password") and value
        )
        (self.workdir / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = self.workdir / "pgbouncer.ini"
        ini.write_text(f"""[databases]
* = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.workdir / "users.txt"}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_reset_query =
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
logfile = {self.workdir / "pgbouncer.log"}
pidfile = {self.workdir / "pgbouncer.pid"}
""")
        if os.getuid() == 0:
            account = pwd.getpwnam(RUN_AS)
            for path in (self.workdir, *self.workdir.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
        return ini

    def start(self) -> None:
        ini = self._write_config()
        command = [self.binary, "-d", ini]
        if os.getuid() == 0:
            command[1:1] = ["-u", RUN_AS]
        subprocess.run(command, check=True, capture_output=True, timeout=10)
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    dbname="postgres",
                    user=self.user,
                    connect_timeout=2,
                    prepare_threshold=None,
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"pgbouncer did not start: {self.log()[-2000:]}") from None
                time.sleep(0.05)

    def pid(self) -> int | None:
        try:
            return int((self.workdir / "pgbouncer.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def stop(self) -> None:
        """Immediate shutdown (SIGTERM): every client connection is cut, as in a crash or a redeploy."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def log(self) -> str:
        try:
            return (self.workdir / "pgbouncer.log").read_text()
        except FileNotFoundError:
            return ""
