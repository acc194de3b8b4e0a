"""The installed distribution imports as `dygo` only: it lives beside a project's own packages.

A project with its own `app`, `jobs`, `store` and `worker` packages installs dygo (not editable,
from this repository) into a fresh virtualenv, imports both, and runs its jobs with `dygo worker`
and `dygo serve` from that virtualenv.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port, wait_until
from tests.test_init import empty_db_url  # noqa: F401

# Building, installing into a fresh virtualenv and deploying take minutes on a busy machine.
pytestmark = pytest.mark.timeout(600)
# The distribution's name on the package index (`dygo` there is another project); it imports as `dygo`.
WHEEL_NAME = "dygo_jobs-0.1.0"

PROJECT = {
    "app/__init__.py": "NAME = 'the project app'\n",
    "store/__init__.py": "NAME = 'the project store'\n",
    "worker/__init__.py": "NAME = 'the project worker'\n",
    "jobs/__init__.py": """
        import app
        import store
        import worker

        from dygo import JobContext, job


        @job("project.hello")
        def hello(ctx: JobContext, args: dict) -> dict:
            return {"app": app.NAME, "store": store.NAME, "worker": worker.NAME, "who": args["who"]}
        """,
    "config/queues.yml": "queues:\n  - name: default\n    concurrency: 4\n",
    "enqueue_one.py": """
        import os
        import sys

        import psycopg

        import app
        import jobs  # noqa: F401  (the project's handlers, registered)
        import store
        from dygo import enqueue

        assert app.NAME == "the project app" and store.NAME == "the project store"
        assert not any(name in sys.modules for name in ("dygo.app", "dygo.worker")), "enqueue needs no server code"
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            print(enqueue(conn, "project.hello", {"who": "me"}).id)
        """,
}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, as they are published (`python -m build`), passing `twine check`."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert sorted(path.name for path in out.iterdir()) == [f"{WHEEL_NAME}-py3-none-any.whl", f"{WHEEL_NAME}.tar.gz"]
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir())], capture_output=True, text=True
    )
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, dist: Path) -> Path:
    """A fresh virtualenv with the built wheel installed into it the way a user would: `pip install <wheel>`."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)
    wheel = next(dist.glob("*.whl"))
    done = subprocess.run(
        [str(env_dir / "bin" / "pip"), "install", "--quiet", str(wheel)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return env_dir


def test_installed_dygo_runs_a_project_that_has_its_own_app_jobs_store_and_worker(
    installed: Path, tmp_path: Path, db_url: str
) -> None:
    project = tmp_path / "project"
    for name, text in PROJECT.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DYGO_", "PYTHON"))}
    env |= {"DATABASE_URL": db_url, "PYTHONPATH": str(project)}
    python, dygo = str(installed / "bin" / "python"), str(installed / "bin" / "dygo")

    def run(*command: str) -> str:
        done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
        return done.stdout

    location = run(python, "-c", "import dygo.store, dygo.app, dygo.worker; print(dygo.store.__file__)")
    assert str(installed) in location and str(REPO) not in location
    # The migrations ship: the installed ones build the installed snapshot, and the legacy ones are there.
    assert run(python, "-m", "dygo.store.schema").strip() == "store/schema.sql matches the migrations"
    legacy = "from dygo.store.migrate import LEGACY_DIR, available_migrations as a; print(len(a(LEGACY_DIR)))"
    assert run(python, "-c", legacy).strip() == "15"
    job_id = run(python, "enqueue_one.py").strip()
    run(dygo, "worker", "--once")

    port = free_port()
    serve = subprocess.Popen(
        [dygo, "serve", "--port", str(port)],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            def answers() -> bool:
                try:
                    return client.get("/healthz").status_code == 200
                except httpx.TransportError:
                    assert serve.poll() is None, f"dygo serve exited: {serve.communicate()[1][-3000:]}"
                    return False

            wait_until(answers, message="the installed dygo serve to answer")
            job = client.get(f"/api/v1/jobs/{job_id}").json()
            assert job["state"] == "succeeded", job
            assert job["result"] == {
                "app": "the project app",
                "store": "the project store",
                "worker": "the project worker",
                "who": "me",
            }
            dashboard = client.get(f"/dashboard/jobs/{job_id}")  # templates ship with the package
            assert dashboard.status_code == 200 and "project.hello" in dashboard.text
    finally:
        serve.terminate()
        serve.wait(10)


def test_repository_code_is_never_loaded_under_a_second_top_level_name() -> None:
    """One registry, one config: `store` and `dygo.store` would be two modules with two registries."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys
        import dygo.cli, dygo.app.main, dygo.worker.runtime, dygo.store.registry  # noqa: F401
        import tests.jobs  # noqa: F401
        twice = sorted(name for name in sys.modules if name.split(".")[0] in ("store", "app", "worker"))
        print(twice)
        """),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_generated_project_deploys_from_the_wheel_under_honcho_as_a_buildpack_runs_it(
    installed: Path,
    dist: Path,
    tmp_path: Path,
    empty_db_url: str,  # noqa: F811
) -> None:
    bin_dir = installed / "bin"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DYGO_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"  # the platform's Python, with the requirements installed
    made = subprocess.run(
        [str(bin_dir / "dygo"), "init", "shop"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    project = tmp_path / "shop"
    assert (project / "requirements.txt").read_text() == "dygo-jobs==0.1.0\n"
    assert (project / ".python-version").read_text() == f"{sys.version_info.major}.{sys.version_info.minor}\n"
    manifest = json.loads((project / "app.json").read_text())
    assert manifest["addons"] == [{"plan": "heroku-postgresql"}]
    assert set(manifest["formation"]) == {"web", "worker"}
    assert {"release", "web", "worker"} == {
        line.split(":")[0] for line in (project / "Procfile").read_text().splitlines()
    }
    # What the buildpack installs is this wheel (the requirement names the distribution the index has it under).
    pip = [
        str(bin_dir / "pip"),
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(dist),
        "-r",
        "requirements.txt",
    ]
    installing = subprocess.run(pip, cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert installing.returncode == 0, installing.stderr
    # The platform's environment: app.json's values and generated secrets, the add-on's DATABASE_URL, PORT.
    for name, spec in manifest["env"].items():
        env[name] = spec["value"] if "value" in spec else secrets.token_hex(32)
    port = free_port()
    env |= {"DATABASE_URL": empty_db_url, "PORT": str(port)}
    honcho = str(bin_dir / "honcho")
    release = subprocess.run(
        [honcho, "start", "release"], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert release.returncode == 0 and "applied" in release.stdout, release.stdout + release.stderr
    running = subprocess.Popen(
        [honcho, "start", "web", "worker"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    auth = {"Authorization": f"Bearer {env['DYGO_ADMIN_TOKEN']}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20, headers=auth) as client:

            def answers() -> bool:
                assert running.poll() is None, f"honcho exited: {running.communicate()[0][-3000:]}"
                try:
                    return client.get("/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(answers, timeout=60, message="the deployed web process to answer")
            assert client.get("/api/v1/jobs", headers={"Authorization": ""}).status_code == 401  # production: a token
            created = client.post("/api/v1/jobs", json={"kind": "hello.greet", "args": {"name": "Ada"}})
            assert created.status_code == 201, created.text
            job = client.get(f"/api/v1/jobs/{created.json()['id']}", params={"wait": "15s"}).json()
            assert job["state"] == "succeeded" and job["result"] == {"greeting": "Hello, Ada!"}, job
    finally:
        os.killpg(running.pid, signal.SIGTERM)
        try:
            running.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait(5)
