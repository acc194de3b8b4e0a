"""`dygo init`: a generated project runs its example job with the installed `dygo` command, from its own folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import make_conninfo

DYGO = str(Path(sys.executable).parent / "dygo")  # the console script, as a user runs it
SEED_QUEUES = "queues:\n  - name: default\n    concurrency: 4\n"


def project_env(url: str | None = None) -> dict[str, str]:
    """The user's shell: no PYTHONPATH pointing at dygo's repository, no DYGO_* from the test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_") and k not in ("PYTHONPATH", "DATABASE_URL")}
    if url is not None:
        env["DATABASE_URL"] = url
    return env


def run(args: list[str], cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=project_env(url), capture_output=True, text=True, timeout=90)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A database with no tables at all: the generated project's `dygo migrate` creates them."""
    name = f"dygo_init_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield make_conninfo(server_url, dbname=name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_init_project_runs_its_example_job_in_a_worker(tmp_path: Path, empty_db_url: str) -> None:
    made = run([DYGO, "init", "shop"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "shop"
    assert (project / "config" / "queues.yml").read_text() == SEED_QUEUES
    for name in (
        "config/dygo.yml",
        "config/schedules.yml",
        "jobs/__init__.py",
        "jobs/hello.py",
        "jobs/test_hello.py",
        "Procfile",
        "requirements.txt",
        ".python-version",
        "app.json",
        ".gitignore",
    ):
        assert (project / name).is_file(), name
    assert "release: dygo migrate" in (project / "Procfile").read_text()
    assert ".dygo/" in (project / ".gitignore").read_text()
    assert "cd shop && dygo migrate" in made.stdout and "honcho start" in made.stdout

    migrated = run([DYGO, "migrate"], cwd=project, url=empty_db_url)
    assert migrated.returncode == 0, migrated.stderr
    assert "applied" in migrated.stdout

    # Enqueue the way the project's own code would: its `jobs` package, dygo's public face.
    enqueue = (
        "import os, psycopg, jobs\n"
        "from dygo import enqueue\n"
        "with psycopg.connect(os.environ['DATABASE_URL'], autocommit=True) as conn:\n"
        "    print(enqueue(conn, 'hello.greet', {'name': 'Ada'}).id)\n"
    )
    enqueued = run([sys.executable, "-c", enqueue], cwd=project, url=empty_db_url)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = int(enqueued.stdout.strip())

    worker = run([DYGO, "worker", "--once"], cwd=project, url=empty_db_url)
    assert worker.returncode == 0, worker.stderr
    assert f"job {job_id} hello.greet attempt 1/5 succeeded" in worker.stderr

    with psycopg.connect(empty_db_url) as conn:
        state, result = conn.execute("SELECT state, result FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()
    assert (state, result) == ("succeeded", {"greeting": "Hello, Ada!"})

    # The generated test passes too, run as the project would run it.
    tested = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "jobs"], cwd=project)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout


def test_init_refuses_to_overwrite_existing_files(tmp_path: Path) -> None:
    (tmp_path / "Procfile").write_text("web: my-own-server\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "hello.py").write_text("# mine\n")

    refused = run([DYGO, "init"], cwd=tmp_path)

    assert refused.returncode == 1
    assert "refusing to overwrite" in refused.stderr
    assert "jobs/hello.py" in refused.stderr and "Procfile" in refused.stderr
    assert "config/queues.yml" not in refused.stderr
    # Nothing written: not the files that were free, and the existing ones untouched.
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "Procfile",
        "jobs",
        "jobs/hello.py",
    ]
    assert (tmp_path / "Procfile").read_text() == "web: my-own-server\n"
    assert (tmp_path / "jobs" / "hello.py").read_text() == "# mine\n"


def test_init_twice_refuses_the_second_time(tmp_path: Path) -> None:
    assert run([DYGO, "init", "app"], cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in (tmp_path / "app").rglob("*") if p.is_file()}

    again = run([DYGO, "init", "app"], cwd=tmp_path)

    assert again.returncode == 1
    assert "config/queues.yml" in again.stderr and ".gitignore" in again.stderr and "app.json" in again.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "app").rglob("*") if p.is_file()} == before


def test_generated_dygo_yml_shows_every_setting_and_each_example_parses(tmp_path: Path) -> None:
    from dygo.store.config import SETTING_KEYS, load_settings

    from dygo.scaffold import DYGO_YML, QUEUES_YML

    uncommented = "\n".join(line[2:] if re.match(r"^# ?\s*[a-z_]+:", line) else line for line in DYGO_YML.splitlines())
    (tmp_path / "dygo.yml").write_text(uncommented)
    (tmp_path / "queues.yml").write_text(QUEUES_YML)
    assert set(yaml.safe_load(uncommented)) == set(SETTING_KEYS)
    settings = load_settings(tmp_path)
    assert settings.job_modules == ("jobs",) and settings.lease_ttl == 30.0 and len(settings.api_tokens) >= 2
