"""Fixtures: a real PostgreSQL (embedded, or DATABASE_URL), a fresh database per test, real processes."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dygo.store import embedded
from dygo.store.config import load_settings
from dygo.store.loading import load_jobs
from dygo.store.migrate import migrate
from psycopg.conninfo import make_conninfo

from tests.pgbouncer import PgBouncer
from tests.pgbouncer import missing_reason as pgbouncer_missing

REPO = Path(__file__).resolve().parent.parent
# Example projects, whose own tests run as their users run them (tests/test_testing_plugin.py).
collect_ignore = ["projects"]
TEST_CONFIG = REPO / "tests" / "config"
TEMPLATE = f"dygo_test_template_{os.getpid()}"
TEST_TABLES = """
CREATE TABLE test_runs (
    job_id  bigint  NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    note    text,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


TEST_SERVER_DIR = REPO / ".dygo" / "test"
# Parallel test processes (pytest -n) share the server: each runs workers and serves of its own.
TEST_SERVER_CONNECTIONS = 400


def _runs_tests_itself(config: pytest.Config) -> bool:
    """This process is the main pytest process, not one of pytest-xdist's workers (which it starts after its
    own configure and stops before its own unconfigure)."""
    return not hasattr(config, "workerinput")


def _start_test_server(config: pytest.Config) -> None:
    """The main process starts the embedded server once and stops it at the end if it started it, so that
    parallel workers share one server and none stops it under another."""
    if os.environ.get("DATABASE_URL") or not _runs_tests_itself(config):
        return
    config.stash[_STARTED_SERVER] = not embedded.status(TEST_SERVER_DIR).running
    url = embedded.ensure_running(TEST_SERVER_DIR)
    with psycopg.connect(url, autocommit=True) as admin:
        enough = int(admin.execute("SHOW max_connections").fetchone()[0]) >= TEST_SERVER_CONNECTIONS
        if not enough:
            admin.execute(f"ALTER SYSTEM SET max_connections = {TEST_SERVER_CONNECTIONS}")
    if not enough:  # a restart applies it, once: the setting stays in the data directory
        embedded.stop(TEST_SERVER_DIR)
        embedded.ensure_running(TEST_SERVER_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_STARTED_SERVER, False):
        embedded.stop(TEST_SERVER_DIR)


_STARTED_SERVER = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def server_url() -> str:
    """The PostgreSQL server tests create their databases on."""
    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"]
    return embedded.ensure_running(TEST_SERVER_DIR)


@pytest.fixture(scope="session")
def template_url(server_url: str) -> Iterator[str]:
    """A migrated database that every test database is copied from."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        admin.execute(f"CREATE DATABASE {TEMPLATE}")
    url = make_conninfo(server_url, dbname=TEMPLATE)
    with psycopg.connect(url) as conn:
        migrate(conn)
        conn.execute(TEST_TABLES)
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")


class FreshDatabases:
    """Fresh copies of the template, made ahead by a thread of their own while tests run, and dropped there
    after use: a copy takes ~0.4 s (its checkpoint) and a drop ~0.05 s, which made a third of the suite's
    time when each test waited for both."""

    AHEAD = 2  # copies kept ready

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.ready: queue.Queue[str] = queue.Queue()
        self.spent: queue.Queue[str] = queue.Queue()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._keep_ready, name="fresh-databases", daemon=True)
        self.thread.start()

    def take(self) -> str:
        """A fresh database's name (waits for one to be ready)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError("making fresh test databases failed") from self.error
            try:
                return self.ready.get(timeout=0.1)
            except queue.Empty:
                continue
        raise AssertionError("no fresh test database within 120 s")

    def give_back(self, name: str) -> None:
        self.spent.put(name)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(60)
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            for waiting in (self.ready, self.spent):
                while not waiting.empty():
                    admin.execute(f"DROP DATABASE IF EXISTS {waiting.get()} WITH (FORCE)")

    def _keep_ready(self) -> None:
        try:
            with psycopg.connect(self.server_url, autocommit=True) as admin:
                while not self.stopping.is_set():
                    try:  # drops first: they free the disk the copies take
                        admin.execute(f"DROP DATABASE IF EXISTS {self.spent.get_nowait()} WITH (FORCE)")
                        continue
                    except queue.Empty:
                        pass
                    if self.ready.qsize() < self.AHEAD:
                        name = f"dygo_test_{uuid.uuid4().hex[:12]}"
                        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
                        self.ready.put(name)
                    else:
                        self.stopping.wait(0.05)
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits for a database
            self.error = exc


@pytest.fixture(scope="session")
def fresh_databases(server_url: str, template_url: str) -> Iterator[FreshDatabases]:
    databases = FreshDatabases(server_url)
    yield databases
    databases.close()


def pytest_configure(config: pytest.Config) -> None:
    _start_test_server(config)
    config.addinivalue_line(
        "markers",
        "shared_database: the test (every test, on a module) uses the module's one database (module_db_url) and "
        "one `dygo serve` (module_api)",
    )
    config.addinivalue_line("markers", "own_database: this test keeps a fresh database in a shared_database module")
    config.addinivalue_line(
        "markers",
        "alone: the module's tests measure time (a recovery within a second, a rate per second), so `make test` "
        "runs them after the parallel part, with no other test beside them",
    )


def shares_database(request: pytest.FixtureRequest) -> bool:
    """A test marked `shared_database` (or in a module so marked), not `own_database`. Its `db_url`, `conn`,
    `spawn` and `serve` are the module's database, and its `api` the module's one server: each such test
    reads and counts only the rows it made, so the tests pass in any order."""
    node = request.node
    return node.get_closest_marker("shared_database") is not None and node.get_closest_marker("own_database") is None


@pytest.fixture
def db_url(
    request: pytest.FixtureRequest, server_url: str, fresh_databases: FreshDatabases, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh migrated database for this test (the module's in a shared_database module); DATABASE_URL
    points at it."""
    if shares_database(request):
        url = request.getfixturevalue("module_db_url")
        monkeypatch.setenv("DATABASE_URL", url)
        yield url
        return
    name = fresh_databases.take()
    url = make_conninfo(server_url, dbname=name)
    monkeypatch.setenv("DATABASE_URL", url)
    yield url
    fresh_databases.give_back(name)


@pytest.fixture(scope="session")
def pgbouncer(server_url: str) -> Iterator[PgBouncer]:
    """A real PgBouncer in transaction pooling mode in front of the test server (tests/pgbouncer.py);
    `pgbouncer.url(db_url)` is a test database through it. Skipped, with the reason, where it cannot run."""
    reason = pgbouncer_missing()
    if reason:
        pytest.skip(reason)
    workdir = REPO / ".dygo" / f"pgbouncer-{os.getpid()}"  # not under /tmp/pytest-of-root: PgBouncer's user reads it
    bouncer = PgBouncer(server_url, workdir)
    bouncer.start()
    yield bouncer
    bouncer.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="session", autouse=True)
def test_jobs() -> None:
    """Register the test kinds in this process too, so enqueue validates them."""
    load_jobs(load_settings(TEST_CONFIG))


def dygo_env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_")}
    env.update(DATABASE_URL=db_url, DYGO_CONFIG_DIR=str(TEST_CONFIG), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class DygoProcess:
    """A real `dygo ...` process; stdout is read for lifecycle lines, stderr kept in a file."""

    def __init__(self, db_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        fd, path = tempfile.mkstemp(prefix="dygo-stderr-", suffix=".log")
        self.stderr_path = Path(path)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dygo", *args],
            cwd=REPO,
            env=env or dygo_env(db_url),
            stdout=subprocess.PIPE,
            stderr=fd,
            text=True,
        )
        os.close(fd)
        self.lines: list[str] = []

    def wait_for_line(self, fragment: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line:
                self.lines.append(line)
                if fragment in line:
                    return line
            elif self.process.poll() is not None:
                break
        raise AssertionError(
            f"no {fragment!r} from dygo {' '.join(self.args)}; stdout={self.lines} stderr={self.stderr()[-3000:]}"
        )

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        code = self.process.wait(timeout)
        assert self.process.stdout is not None
        self.lines += self.process.stdout.readlines()
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        if self.process.stdout:
            self.process.stdout.close()


@pytest.fixture
def spawn(db_url: str) -> Iterator:
    """Start `dygo` processes against this test's database; all are killed at the end."""
    started: list[DygoProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> DygoProcess:
        process = DygoProcess(db_url, *args, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.02, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


# --- The admin API: a real `dygo serve` ---------------------------------------------------------

# Random, as production requires (app/auth.py weak_token); fixed, so a failing test can be rerun by hand.
ADMIN_TOKEN = "femxHm06xunaekziRoMSszkIDKyBoc_3LknpKpRDAmo"
READ_TOKEN = "Z6aBojPGPHC5t_eQTecuhrypZD50Vcehw3fiproYgWU"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """A running `dygo serve`, with a client per role: admin, reader (read-only token) and anon."""

    def __init__(self, process: DygoProcess, port: int) -> None:
        import httpx

        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.admin = httpx.Client(base_url=self.url, timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        self.reader = httpx.Client(base_url=self.url, timeout=10, headers={"Authorization": f"Bearer {READ_TOKEN}"})
        self.anon = httpx.Client(base_url=self.url, timeout=10)

    def wait_until_healthy(self) -> None:
        import httpx

        def healthy() -> bool:
            try:
                return self.anon.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, message="serve to answer /healthz")

    def close(self) -> None:
        for client in (self.admin, self.reader, self.anon):
            client.close()


def start_serve(db_url: str, starter, *args: str, tokens: bool = True, **env: str) -> Api:
    """`dygo serve` on a free port; with tokens (the default) the API needs ADMIN_TOKEN or READ_TOKEN."""
    port = free_port()
    if tokens:
        env = {"DYGO_ADMIN_TOKEN": ADMIN_TOKEN, "DYGO_READ_TOKEN": READ_TOKEN, **env}
    process = starter("serve", "--port", str(port), *args, env=dygo_env(db_url, **env))
    process.wait_for_line("dygo serve: auth")
    api = Api(process, port)
    api.wait_until_healthy()
    return api


@pytest.fixture
def serve(db_url: str, spawn) -> Iterator:
    """Start `dygo serve` processes for this test (see start_serve)."""
    started: list[Api] = []

    def start(*args: str, tokens: bool = True, **env: str) -> Api:
        api = start_serve(db_url, spawn, *args, tokens=tokens, **env)
        started.append(api)
        return api

    yield start
    for api in started:
        api.close()


@pytest.fixture
def api(request: pytest.FixtureRequest, serve) -> Api:
    """`dygo serve` in development on localhost, with an admin and a read-only token configured (the
    module's one server in a shared_database module)."""
    if shares_database(request):
        return request.getfixturevalue("module_api")
    return serve()


@pytest.fixture(scope="module")
def module_db_url(server_url: str, fresh_databases: FreshDatabases) -> Iterator[str]:
    """A fresh migrated database shared by one module's tests (for read-mostly, server-per-module tests)."""
    name = fresh_databases.take()
    yield make_conninfo(server_url, dbname=name)
    fresh_databases.give_back(name)


@pytest.fixture
def replica_url(server_url: str, fresh_databases: FreshDatabases) -> Iterator[str]:
    """A second fresh database standing in for DATABASE_READ_URL's replica: what a page or a list shows tells
    which of the two it read (a real streaming replica is chaos/failover.py's)."""
    name = fresh_databases.take()
    yield make_conninfo(server_url, dbname=name)
    fresh_databases.give_back(name)


@pytest.fixture(scope="module")
def module_api(module_db_url: str) -> Iterator[Api]:
    """One `dygo serve` (tokens configured) for a whole module."""
    processes: list[DygoProcess] = []

    def starter(*args: str, env: dict[str, str] | None = None) -> DygoProcess:
        processes.append(DygoProcess(module_db_url, *args, env=env))
        return processes[-1]

    api = start_serve(module_db_url, starter)
    yield api
    api.close()
    for process in processes:
        process.stop()
