"""The manual's reference against reality: every command and flag of the `dygo` parser, every config key,
every environment variable the code reads, every OpenAPI path and every metric a real process serves is
named in docs/reference/. A flag, key, endpoint or metric added without its line in the manual fails here."""

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

from dygo.cli import build_parser
from store import config, schedules
from store.config import load_settings
from store.registry import registry
from tests.conftest import REPO, TEST_CONFIG

REFERENCE = REPO / "docs" / "reference"
SOURCE_PACKAGES = ("store", "app", "worker", "dygo")
# Read by the code but not a setting of dygo's: the embedded server's lock folder, set by dygo itself.
NOT_SETTINGS = {"XDG_RUNTIME_DIR"}


def reference(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


def absent(names: set[str], page: str, spell=lambda name: f"| `{name}`") -> list[str]:
    """The names the page has no table row for (a row starts with the name in backticks), or that it does not
    spell as `spell` says: a mention in passing does not count as documented."""
    text = reference(page)
    return sorted(name for name in names if spell(name) not in text)


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _subcommands(sub, f"{prefix} {name}")


def cli_surface() -> tuple[set[str], set[str], set[str]]:
    """(commands such as 'dygo jobs list', long flags such as '--poll-interval', positional choices)."""
    commands, flags, choices = set(), set(), set()
    for command, parser in _subcommands(build_parser(), "dygo"):
        commands.add(command)
        for action in parser._actions:
            flags |= {option for option in action.option_strings if option.startswith("--") and option != "--help"}
            if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction):
                choices |= set(action.choices)
    return commands, flags, choices


def test_cli_reference_names_every_command_and_flag() -> None:
    commands, flags, choices = cli_surface()
    assert {"dygo init", "dygo worker", "dygo jobs list"} <= commands and "--poll-interval" in flags
    text = reference("cli.md")
    assert [command for command in sorted(commands) if f"| `{command}" not in text] == []
    assert absent(flags, "cli.md", spell=lambda flag: f"| `{flag}") == []
    assert [choice for choice in sorted(choices) if choice not in text] == []


def test_cli_reference_matches_the_help_output() -> None:
    """What a user reads in `dygo --help`: each command it lists is in the reference."""
    shown = subprocess.run([sys.executable, "-m", "dygo", "--help"], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    listed = re.findall(r"^ {4}(\w[\w-]*) ", shown.stdout, flags=re.M)
    assert "worker" in listed and "init" in listed
    assert [name for name in listed if f"| `dygo {name}" not in reference("cli.md")] == []


def test_configuration_reference_names_every_key_and_environment_variable() -> None:
    queue_keys = {field.name for field in dataclasses.fields(config.Queue)}
    assert absent(queue_keys, "configuration.md", spell=lambda key: f"{key}:") == []
    assert absent(set(config.SETTING_PARSERS), "configuration.md") == []
    assert absent(set(schedules.FILE_KEYS), "configuration.md") == []

    read = set()
    for package in SOURCE_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            read |= set(re.findall(r"""["']((?:DYGO|DATABASE)_[A-Z0-9_]+|PORT)["']""", text))
            read |= set(re.findall(r"""os\.environ(?:\.get\(|\[)["']([A-Z0-9_]+)["']""", text))
    read -= NOT_SETTINGS
    assert {"DATABASE_URL", "DYGO_ADMIN_TOKEN", "DYGO_LOG_LEVEL"} <= read
    assert absent(read, "configuration.md") == []


def test_http_api_reference_names_every_openapi_path() -> None:
    from app.main import create_app  # the document is built without a database: the lifespan never runs

    settings = load_settings(TEST_CONFIG)
    paths = create_app(settings, registry, "postgresql://unused.invalid/dygo").openapi()["paths"]
    operations = {f"{method.upper()} {re.sub(r'{[^}]*}', '{}', path)}" for path, methods in paths.items()
                  for method in methods}
    assert "POST /api/v1/jobs/{}/run-now" in operations and len(operations) > 20
    text = re.sub(r"{[^}]*}", "{}", reference("http-api.md"))
    assert sorted(operation for operation in operations if f"| `{operation}" not in text) == []


def _metric_names(exposition: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", exposition, flags=re.M))


def test_metrics_reference_names_every_metric(api, spawn) -> None:
    served = _metric_names(api.reader.get("/metrics").text)
    worker = spawn("worker", "--metrics-port", "0", "--poll-interval", "1s")
    port = worker.wait_for_line("dygo worker metrics: http://").rsplit(":", 1)[1].split("/")[0]
    served |= _metric_names(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    assert {"dygo_jobs", "dygo_jobs_enqueued_total", "dygo_worker_busy_slots"} <= served
    assert absent({name for name in served if name.startswith("dygo_")}, "metrics.md") == []


def test_manual_builds_without_a_broken_link(tmp_path: Path) -> None:
    built = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--quiet",
                            "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
