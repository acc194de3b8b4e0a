"""The manual's reference against reality, both ways: every command and flag of the `dygo` parser, every
config key, every environment variable the code reads, every OpenAPI operation and every metric a real
process serves has its table row in docs/reference/, and every row there names something that exists;
docs/development.md's layout names every module.
A flag, key, endpoint or metric added without its row (or removed with its row left behind) fails here."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from dygo.store import config, schedules
from dygo.store.config import load_settings
from dygo.store.registry import registry

from dygo.cli import build_parser
from tests.conftest import REPO, TEST_CONFIG

REFERENCE = REPO / "docs" / "reference"
SOURCE_PACKAGES = ("store", "app", "worker", "dygo")
# Read by the code but not a setting of dygo's: the embedded server's lock folder, which dygo sets itself.
NOT_SETTINGS = {"XDG_RUNTIME_DIR"}
# Documented but read by a dependency, not by dygo's code: uvicorn's trusted proxies.
READ_BY_DEPENDENCIES = {"FORWARDED_ALLOW_IPS"}


def section(page: str, heading: str | None = None) -> str:
    """A reference page, or the part of it under `## heading` (up to the next `## `)."""
    text = (REFERENCE / page).read_text(encoding="utf-8")
    if heading is None:
        return text
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert heading in sections, f"docs/reference/{page} has no '## {heading}' section"
    return sections[heading]


def rows(text: str, pattern: str = r"[^`\s]+", any_cell: bool = False) -> set[str]:
    """What the table rows of `text` name: the backticked start of their first cell (`| \\`name ...\\` |`),
    or with `any_cell` of any cell (the jobs flags table has the command first, then the flag)."""
    cells_before = r"(?: [^|\n]*\|)*?" if any_cell else ""
    return set(re.findall(rf"^\|{cells_before} `({pattern})", text, flags=re.M))


# --- command line ---------------------------------------------------------------------------------

FLAG = "--[a-z-]+"


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _subcommands(sub, f"{prefix} {name}")


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def test_cli_reference_has_a_row_for_every_command_and_flag() -> None:
    commands = dict(_subcommands(build_parser(), "dygo"))
    assert {"dygo init", "dygo worker", "dygo jobs list", "dygo db"} <= set(commands)
    table = section("cli.md", "Commands")
    assert sorted(command for command in commands if f"| `{command}" not in table) == []
    common = rows(section("cli.md", "Common flags"), FLAG)
    missing = []
    for command, parser in commands.items():
        # A command's own flags are under `## <Command> flags` (jobs list: Jobs flags); --env and
        # --log-format under Common flags.
        own_heading = f"{command.split()[1].capitalize()} flags"
        has_own = f"## {own_heading}" in section("cli.md")
        own = rows(section("cli.md", own_heading), FLAG, any_cell=True) if has_own else set()
        missing += [f"{command} {flag}" for flag in sorted(_flags(parser) - own - common)]
        for action in parser._actions:  # positional choices: `dygo db url|status|start|stop`
            if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction):
                missing += [f"{command} {choice}" for choice in action.choices if choice not in table]
    assert missing == []


def test_cli_reference_documents_no_flag_that_does_not_exist() -> None:
    real = set().union(*(_flags(parser) for _, parser in _subcommands(build_parser(), "dygo")))
    assert sorted(rows(section("cli.md"), FLAG, any_cell=True) - real) == []


def test_cli_reference_matches_the_help_output() -> None:
    """What a user reads in `dygo --help`: each command it lists has its row."""
    shown = subprocess.run(
        [sys.executable, "-m", "dygo", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    listed = re.findall(r"^ {4}(\w[\w-]*) ", shown.stdout, flags=re.M)
    assert "worker" in listed and "init" in listed
    assert [name for name in listed if f"| `dygo {name}" not in section("cli.md", "Commands")] == []


# --- configuration --------------------------------------------------------------------------------


def _environment_variables() -> set[str]:
    read = set()
    for package in SOURCE_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            read |= set(re.findall(r"""["']((?:DYGO|DATABASE)_[A-Z0-9_]+|PORT)["']""", text))
            read |= set(re.findall(r"""os\.environ(?:\.get\(|\[)["']([A-Z0-9_]+)["']""", text))
            read |= set(re.findall(r"""^[A-Z0-9_]+_ENV\s*=\s*["']([A-Z0-9_]+)["']""", text, re.M))  # named once
    return read - NOT_SETTINGS


def test_configuration_reference_has_a_row_for_every_key_and_environment_variable() -> None:
    queues = section("configuration.md", "config/queues.yml")
    assert [key for key in (f.name for f in dataclasses.fields(config.QueueConfig)) if f"{key}:" not in queues] == []
    assert sorted(set(config.SETTING_KEYS) - rows(section("configuration.md", "config/dygo.yml"))) == []
    assert sorted(set(schedules.FILE_KEYS) - rows(section("configuration.md", "config/schedules.yml"))) == []
    read = _environment_variables()
    assert {"DATABASE_URL", "DYGO_ADMIN_TOKEN", "DYGO_LOG_LEVEL", "PORT"} <= read
    assert sorted(read - rows(section("configuration.md", "Environment variables"))) == []


def test_configuration_reference_documents_no_key_that_does_not_exist() -> None:
    assert sorted(rows(section("configuration.md", "config/dygo.yml")) - set(config.SETTING_KEYS)) == []
    assert sorted(rows(section("configuration.md", "config/schedules.yml")) - set(schedules.FILE_KEYS)) == []
    documented = rows(section("configuration.md", "Environment variables"))
    assert sorted(documented - _environment_variables() - READ_BY_DEPENDENCIES) == []


# --- HTTP API -------------------------------------------------------------------------------------

OPERATION = r"(?:GET|POST|PUT|PATCH|DELETE) /[^`?\s]*"


def _normalised(operation: str) -> str:
    return re.sub(r"{[^}]*}", "{}", operation)  # `{job_id}` in the code is `{id}` in the manual


def test_http_api_reference_has_a_row_for_every_openapi_operation_and_no_other() -> None:
    from dygo.app.main import create_app  # the document is built without a database: the lifespan never runs

    paths = create_app(load_settings(TEST_CONFIG), registry, "postgresql://unused.invalid/dygo").openapi()["paths"]
    real = {_normalised(f"{method.upper()} {path}") for path, methods in paths.items() for method in methods}
    assert "POST /api/v1/jobs/{}/run-now" in real and len(real) > 20
    documented = {_normalised(operation) for operation in rows(section("http-api.md"), OPERATION)}
    assert sorted(real - documented) == []
    assert sorted(documented - real) == []


# --- metrics --------------------------------------------------------------------------------------


def _metric_names(exposition: str) -> set[str]:
    return {name for name in re.findall(r"^# TYPE (\S+) ", exposition, flags=re.M) if name.startswith("dygo_")}


def test_metrics_reference_has_a_row_for_every_metric_served_and_no_other(api, spawn) -> None:
    served = _metric_names(api.reader.get("/metrics").text)
    worker = spawn("worker", "--metrics-port", "0", "--poll-interval", "1s")
    port = worker.wait_for_line("dygo worker metrics: http://").rsplit(":", 1)[1].split("/")[0]
    worker_served = _metric_names(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    assert {"dygo_jobs", "dygo_jobs_enqueued_total"} <= served and "dygo_worker_busy_slots" in worker_served
    # Cluster metrics (GET /metrics on serve) above "## Worker metrics", a worker's own below it.
    cluster = rows(section("metrics.md").split("## Worker metrics")[0], "dygo_[a-z_]+")
    own = rows(section("metrics.md", "Worker metrics"), "dygo_[a-z_]+")
    assert (sorted(served - cluster), sorted(worker_served - own)) == ([], [])
    assert (sorted(cluster - served), sorted(own - worker_served)) == ([], [])


def test_manual_builds_without_a_broken_link(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            str(Path(sys.executable).parent / "mkdocs"),
            "build",
            "--strict",
            "--quiet",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr


def layout_sections() -> dict[str, str]:
    """docs/development.md's layout block, by folder: the text from a folder's label to the next label."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    parts = re.split(r"^([a-z_/]+/)", block, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_development_layout_names_every_module_of_the_packages() -> None:
    sections = layout_sections()
    missing = [
        f"{folder}{module.name}"
        for folder in ("store/", "worker/", "app/", "app/dashboard/", "dygo/")
        for module in sorted((REPO / folder).glob("*.py"))
        if module.name != "__init__.py" and not re.search(rf"\b{module.stem}\b", sections[folder])
    ]
    assert missing == [], f"docs/development.md's layout does not name {missing}"
