"""Fixtures: a real PostgreSQL (embedded, or DATABASE_URL), a fresh database per test, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from store import embedded
from store.config import load_settings
from store.migrate import migrate
from store.registry import load_jobs

REPO = Path(__file__).resolve().parent.parent
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


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """The PostgreSQL server tests create their databases on."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    data_dir = REPO / ".dygo" / "test"
    was_running = embedded.status(data_dir).running
    url = embedded.ensure_running(data_dir)
    yield url
    if not was_running:
        embedded.stop(data_dir)


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


@pytest.fixture
def db_url(server_url: str, template_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh migrated database for this test; DATABASE_URL points at it."""
    name = f"dygo_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
    url = make_conninfo(server_url, dbname=name)
    monkeypatch.setenv("DATABASE_URL", url)
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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
    env.update(DATABASE_URL=db_url, DYGO_CONFIG_DIR=str(TEST_CONFIG), PYTHONPATH=str(REPO),
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class DygoProcess:
    """A real `dygo ...` process; stdout is read for lifecycle lines, stderr kept in a file."""

    def __init__(self, db_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        fd, path = tempfile.mkstemp(prefix="dygo-stderr-", suffix=".log")
        self.stderr_path = Path(path)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dygo", *args], cwd=REPO, env=env or dygo_env(db_url),
            stdout=subprocess.PIPE, stderr=fd, text=True,
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
        raise AssertionError(f"no {fragment!r} from dygo {' '.join(self.args)}; stdout={self.lines} "
                             f"stderr={self.stderr()[-3000:]}")

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
