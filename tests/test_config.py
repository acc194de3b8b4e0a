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
        (Q + "kinds:\n  - {kind: a.b, concurrency_limit: '5'}\n", "kinds[0] (a.b)", "an integer greater than 0"),
        (Q + "kinds:\n  - {kind: a.b, concurrency_limit: true}\n", "kinds[0] (a.b)", "an integer greater than 0"),
        (Q + "kinds:\n  - {kind: a.b, rate_limit: 5/s, rate_burst: 6}\n", "kinds[0] (a.b)", "at most the rate's"),
        (Q + "kinds:\n  - {kind: a.b, concurrency_limit: 1, rate_burst: 2}\n", "kinds[0] (a.b)", "needs a rate_limit"),
        (
            Q + f"kinds:\n  - {{kind: a.b, concurrency_limit: 1, key: meta.{'t' * 300}}}\n",
            "kinds[0] (a.b)",
            "at most 255 characters",
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
        "queues:\n  - {name: default, concurrency: 4, concurrency_limit: 10, rate_limit: 600/m, rate_burst: 20}\n"
        "kinds:\n  - {kind: a.b, concurrency_limit: 2, key: meta.tenant}\n",
    )
    limits = load_settings(tmp_path).limits
    assert [(lim.scope, lim.name, lim.concurrency_limit, lim.rate, lim.rate_burst, lim.key) for lim in limits] == [
        ("queue", "default", 10, (600, 60.0), 20, None),
        ("kind", "a.b", 2, None, None, "tenant"),
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


# --- one grammar per rule: config, flags and the API's document agree -------------------------------

# fmt: off
DURATION_TEXTS = [
    "0", "0s", "0ms", "00.000m", "30", "30s", "1.5s", "250ms", "5m", "1h", "2d", "366d", "366.0d", "8784h",
    "527040m", "31622400s", "31622400000ms", "366.01d", "367d", "8785h", "527041m", "31622401s", "31622400001ms",
    "366.0000000000000000001d", "1e3", ".5s", "5.s", "5.5.5s", "-1s", "-0", "+1s", "1w", "5sec", "1m1s", "0x10s",
    "s", "ms", "0.0001ms", "0.5", "\u0663\u0660s", " 30 s ", "\t5m\t", "1 h", "30s\n", "", " ", "60", "60.0s",
    "60.5s", "1m", "1.0m", "1.5m", "60000ms", "60001ms", "0.01h",
]
# fmt: on


def _seconds(text: str) -> float | None:
    try:
        return parse_duration(text)
    except ValueError:
        return None


def for_many(strategy, check, examples: int) -> None:
    """`check` on the strings `strategy` draws (hypothesis: a failure is shrunk to its shortest text)."""
    from hypothesis import given, settings

    given(strategy)(settings(max_examples=examples, deadline=None, database=None)(lambda text: check(text)))()


def from_pattern(pattern: str):
    """Strings a pattern itself generates."""
    from hypothesis import strategies as st

    return st.from_regex(pattern.replace("$", r"\Z"), fullmatch=True)


def duration_like():
    """Near-misses and hits of the duration grammar: its pieces in any order, and short random text."""
    from hypothesis import strategies as st

    pieces = st.sampled_from(["", " ", "\t", "-", "0", "00", "1", "9", "36", "366", "367", ".", ".0", ".5", "e"])
    units = st.sampled_from(["", "ms", "s", "m", "h", "d", "w", " s", "S", "\n"])
    joined = st.builds(lambda parts, unit: "".join(parts) + unit, st.lists(pieces, max_size=6), units)
    return joined | st.from_regex(r"[ 0-9.a-z\t-]{0,14}", fullmatch=True)


def test_the_apis_duration_patterns_take_exactly_what_the_duration_grammar_takes():
    import re

    from dygo.app.schemas import DURATION_PATTERN, POSITIVE_DURATION_PATTERN, WAIT_PATTERN

    def agree(text: str) -> None:
        seconds = _seconds(text)
        assert bool(re.fullmatch(DURATION_PATTERN, text)) == (seconds is not None), text
        assert bool(re.fullmatch(POSITIVE_DURATION_PATTERN, text)) == (seconds is not None and seconds > 0), text
        wait = seconds is not None and seconds <= 60 and not re.search(r"[hd][ \t]*$", text)  # ms, s or m
        assert bool(re.fullmatch(WAIT_PATTERN, text)) == wait, text

    for text in DURATION_TEXTS:
        agree(text)
    for_many(duration_like(), agree, 3000)
    for pattern in (DURATION_PATTERN, POSITIVE_DURATION_PATTERN, WAIT_PATTERN):
        for_many(from_pattern(pattern), agree, 300)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(" 30 s ", 30), ("0.5", 0.5), ("366d", 366 * 86400), ("527040m", 366 * 86400), ("31622400000ms", 31622400.0)],
)
def test_durations_take_spaces_fractions_and_up_to_a_year_in_any_unit(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["366.01d", "8785h", "31622400001ms", "366.0000000000000000001d", "\u0663s", "-0"])
def test_durations_past_a_year_or_outside_the_grammar_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_apis_rate_pattern_takes_exactly_what_the_rate_grammar_takes():
    import re

    from dygo.store.config import RATE_PATTERN, parse_rate
    from hypothesis import strategies as st

    def agree(text: str) -> None:
        try:
            parse_rate(text)
            taken = True
        except ValueError:
            taken = False
        assert bool(re.fullmatch(RATE_PATTERN, text)) == taken, text

    for text in [
        "1/s",
        "600/m",
        " 10 / h ",
        "\t5/s",
        "0/h",
        "00001/s",
        "1000000000/h",
        "1000000001/h",
        "10/d",
        "1.5/s",
    ]:
        agree(text)
    counts = st.sampled_from(["", "0", "1", "9", "10", "999999999", "1000000000", "1000000001", "4294967296", "-1"])
    space = st.sampled_from(["", " ", "\t", "  ", "\n"])
    slash, unit = st.sampled_from(["/", "", "//", "."]), st.sampled_from(["s", "m", "h", "d", ""])
    made = st.builds(lambda *parts: "".join(parts), space, counts, space, slash, space, unit, space)
    for_many(made, agree, 2000)
    for_many(from_pattern(RATE_PATTERN), agree, 300)


@pytest.mark.parametrize(
    ("key", "flag", "value", "rule"),
    [
        ("max_concurrency", "positive_int", "0", "must be an integer greater than 0"),
        ("serve_pool_size", "pool_size", "1", "must be an integer of at least 2"),
        ("retention_interval", "positive_duration", "0", "must be a duration greater than 0"),
        ("lease_ttl", "positive_duration", "soon", "'soon' is not a duration"),
        ("default_timeout", "duration", "2y", "'2y' is not a duration"),
    ],
)
def test_a_flag_and_the_setting_it_stands_for_refuse_a_value_with_the_same_rule(tmp_path, key, flag, value, rule):
    import argparse

    from dygo import cli

    write(tmp_path, Q)
    write(tmp_path, f"{key}: '{value}'\n" if not value.isdigit() else f"{key}: {value}\n", "dygo.yml")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert caught.value.entry == key and rule in caught.value.rule
    with pytest.raises(argparse.ArgumentTypeError, match=rule):
        getattr(cli, flag)(value)


def test_the_pool_size_rule_is_one_for_the_file_the_environment_and_the_flag(tmp_path, monkeypatch):
    from dygo import cli

    write(tmp_path, Q)
    write(tmp_path, "serve_pool_size: 3\n", "dygo.yml")
    assert load_settings(tmp_path).serve_pool_size == 3
    monkeypatch.setenv("DYGO_SERVE_POOL_SIZE", "4")
    assert load_settings(tmp_path).serve_pool_size == 4 and cli.pool_size("5") == 5
    monkeypatch.setenv("DYGO_SERVE_POOL_SIZE", "1")
    with pytest.raises(
        ConfigError, match="DYGO_SERVE_POOL_SIZE: environment: must be an integer of at least 2, got '1'"
    ):
        load_settings(tmp_path)


def test_settings_have_the_documented_defaults_and_sizes_take_units(tmp_path):
    write(tmp_path, Q)
    settings = load_settings(tmp_path)
    assert (settings.lease_ttl, settings.default_timeout, settings.claim_ahead, settings.serve_pool_size) == (
        30.0,
        300.0,
        0.005,
        10,
    )
    assert (settings.max_payload_bytes, settings.max_result_bytes, settings.job_modules) == (2**20, 2**16, ("jobs",))
    assert settings.cron is True and settings.default_concurrency is None and settings.api_tokens == ()
    write(
        tmp_path, "max_payload_bytes: 2MiB\nmax_result_bytes: 1000\ndefault_concurrency: 2\ncron: false\n", "dygo.yml"
    )
    settings = load_settings(tmp_path)
    assert (settings.max_payload_bytes, settings.max_result_bytes, settings.default_concurrency) == (2 * 2**20, 1000, 2)
    assert type(settings.max_payload_bytes) is int and settings.cron is False
    write(tmp_path, "max_result_bytes: true\n", "dygo.yml")
    with pytest.raises(ConfigError, match="max_result_bytes: must be a size greater than 0"):
        load_settings(tmp_path)
