"""config/queues.yml and config/dygo.yml: every rule, and the CLI's exit code 2 before any database work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dygo.store.config import load_queues, load_settings
from dygo.store.durations import parse_duration
from dygo.store.errors import ConfigError

from tests.conftest import REPO


def write(tmp_path: Path, text: str, name: str = "queues.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_queues_load_in_order(tmp_path):
    path = write(tmp_path, "queues:\n  - {name: default, concurrency: 4}\n  - {name: slow-imports, concurrency: 1}\n")
    queues = load_queues(path)
    assert list(queues) == ["default", "slow-imports"]
    assert queues["slow-imports"].concurrency == 1


@pytest.mark.parametrize(
    ("text", "entry", "rule"),
    [
        ("queues:\n  - {name: Default, concurrency: 4}\n", "queues[0] (Default)", "kebab-case"),
        ("queues:\n  - {name: my_queue, concurrency: 4}\n", "queues[0] (my_queue)", "kebab-case"),
        ("queues:\n  - {name: default, concurrency: 0}\n", "queues[0] (default)", "greater than 0"),
        ("queues:\n  - {name: default, concurrency: '4'}\n", "queues[0] (default)", "integer greater than 0"),
        (
            "queues:\n  - {name: default, concurrency: 4}\n  - {name: default, concurrency: 2}\n",
            "queues[1] (default)",
            "already used",
        ),
        ("queues:\n  - {name: default, concurrency: 4, rate: 10}\n", "queues[0] (default)", "unknown key 'rate'"),
        ("queues: []\n", "queues", "non-empty list"),
        ("queue:\n  - {name: default, concurrency: 4}\n", "top level", "the key `queues`"),
        ("queues:\n  - default\n", "queues[0]", "must be a mapping"),
        ("queues: [\n", "syntax", "not valid YAML"),
    ],
)
def test_invalid_queues_name_file_entry_and_rule(tmp_path, text, entry, rule):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_queues(path)
    assert caught.value.source == str(path)
    assert caught.value.entry == entry
    assert rule in caught.value.rule


Q = "queues:\n  - {name: default, concurrency: 4}\n"


@pytest.mark.parametrize(
    ("text", "entry", "rule"),
    [
        (
            "queues:\n  - {name: default, concurrency: 4, rate_limit: 10}\n",
            "queues[0] (default)",
            "must be a count per unit",
        ),
        (
            "queues:\n  - {name: default, concurrency: 4, rate_limit: 10/d}\n",
            "queues[0] (default)",
            "must be a count per unit",
        ),
        (Q + "kinds:\n  - {kind: a.b, rate_limit: 0/s}\n", "kinds[0] (a.b)", "at least 1 start"),
        (
            Q + "kinds:\n  - {kind: a.b, concurrency_limit: 0}\n",
            "kinds[0] (a.b)",
            "concurrency_limit must be an integer greater than 0",
        ),
        (Q + "kinds:\n  - {kind: a.b, concurrency_limit: -3}\n", "kinds[0] (a.b)", "greater than 0"),
        (
            Q + "kinds:\n  - {kind: a.b, concurrency_limit: 2, key: args.tenant}\n",
            "kinds[0] (a.b)",
            "not a known key path; use meta.<field>",
        ),
        (
            Q + "kinds:\n  - {kind: a.b, key: meta.tenant}\n",
            "kinds[0] (a.b)",
            "needs a concurrency_limit or a rate_limit",
        ),
        (Q + "kinds:\n  - {kind: a.b}\n", "kinds[0] (a.b)", "needs a concurrency_limit or a rate_limit"),
        (Q + "kinds:\n  - {kind: a.b, concurrency_limit: 1, burst: 2}\n", "kinds[0] (a.b)", "unknown key 'burst'"),
        (
            Q + "kinds:\n  - {kind: a.b, concurrency_limit: 1}\n  - {kind: a.b, rate_limit: 1/s}\n",
            "kinds[1] (a.b)",
            "already limited",
        ),
    ],
)
def test_invalid_limits_name_file_entry_and_rule(tmp_path, text, entry, rule):
    write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert caught.value.source == str(tmp_path / "queues.yml")
    assert caught.value.entry == entry
    assert rule in caught.value.rule


def test_limits_load_per_queue_and_per_kind(tmp_path):
    write(
        tmp_path,
        "queues:\n  - {name: default, concurrency: 4, concurrency_limit: 10, rate_limit: 600/m}\n"
        "kinds:\n  - {kind: a.b, concurrency_limit: 2, key: meta.tenant}\n",
    )
    limits = load_settings(tmp_path).limits
    assert [(lim.scope, lim.name, lim.concurrency_limit, lim.rate, lim.key) for lim in limits] == [
        ("queue", "default", 10, (600, 60.0), None),
        ("kind", "a.b", 2, None, "tenant"),
    ]


def test_a_limit_on_an_unknown_kind_fails_worker_and_serve_start_with_exit_2(tmp_path):
    write(
        tmp_path,
        "queues:\n  - {name: default, concurrency: 4}\n  - {name: other, concurrency: 1}\n"
        "kinds:\n  - {kind: test.nope, concurrency_limit: 2}\n",
    )
    write(tmp_path, "jobs: [tests.jobs]\n", "dygo.yml")
    for command in (["worker"], ["serve"]):
        result = subprocess.run(
            [sys.executable, "-m", "dygo", *command],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": "/usr/bin:/bin",
                "DYGO_CONFIG_DIR": str(tmp_path),
                "PYTHONPATH": str(REPO),
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            },
        )
        assert result.returncode == 2, (command, result.stderr)
        assert f"{tmp_path / 'queues.yml'}: kinds (test.nope): unknown kind 'test.nope'" in result.stderr


def test_missing_queues_file_says_how_to_create_it(tmp_path):
    with pytest.raises(ConfigError, match="not found; create it"):
        load_queues(tmp_path / "queues.yml")


def test_settings_file_values_are_parsed_and_unknown_keys_rejected(tmp_path):
    write(tmp_path, "queues:\n  - {name: default, concurrency: 4}\n")
    write(tmp_path, "lease_ttl: 45s\nmax_reaps: 5\njobs: [jobs]\n", "dygo.yml")
    settings = load_settings(tmp_path)
    assert (settings.lease_ttl, settings.max_reaps, settings.job_modules) == (45.0, 5, ("jobs",))

    write(tmp_path, "lease_tll: 45s\n", "dygo.yml")
    with pytest.raises(ConfigError, match="lease_tll: unknown setting"):
        load_settings(tmp_path)
    write(tmp_path, "lease_ttl: soon\n", "dygo.yml")
    with pytest.raises(ConfigError, match="lease_ttl: value: 'soon' is not a duration"):
        load_settings(tmp_path)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("30s", 30), ("5m", 300), ("1h", 3600), ("2d", 172800), (12, 12), ("1.5s", 1.5)],
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1s", "soon", "10 years", "5w", True])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_missing_default_queue_fails_when_a_job_omits_its_queue(tmp_path):
    write(tmp_path, "queues:\n  - {name: other, concurrency: 1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "dygo", "worker", "--once"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "DYGO_CONFIG_DIR": str(tmp_path),
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        },
    )
    assert result.returncode == 2, result.stderr
    assert "omits its queue, so queue 'default' must exist" in result.stderr


def test_cli_exits_2_on_bad_config_before_touching_the_database(tmp_path):
    write(tmp_path, "queues:\n  - {name: Bad_Name, concurrency: 4}\n")
    for command in (["worker"], ["serve"]):  # not migrate: it reads no queues (test_migrate_needs_no_queues_yml)
        result = subprocess.run(
            [sys.executable, "-m", "dygo", *command],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            # An unreachable database: reaching it would fail differently (and slowly).
            env={
                "PATH": "/usr/bin:/bin",
                "DYGO_CONFIG_DIR": str(tmp_path),
                "PYTHONPATH": str(REPO),
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            },
        )
        assert result.returncode == 2, (command, result.stderr)
        assert f"{tmp_path / 'queues.yml'}: queues[0] (Bad_Name): name 'Bad_Name' must be kebab-case" in result.stderr


def test_unknown_worker_queue_flag_fails_startup(db_url):
    from tests.conftest import dygo_env

    result = subprocess.run(
        [sys.executable, "-m", "dygo", "worker", "--queue", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dygo_env(db_url),
        timeout=60,
    )
    assert result.returncode == 2
    assert "--queue: nope: is not configured" in result.stderr
    assert "configured queues: default, other" in result.stderr
