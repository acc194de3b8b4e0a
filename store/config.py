"""Load and validate `config/queues.yml` and the optional `config/dygo.yml`.

Every error names the file, the entry and the rule it breaks, and is raised before any
database work so the CLI can exit 2 with a message a person can act on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dygo.store.durations import parse_duration
from dygo.store.errors import ConfigError

KEBAB_CASE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
ENVIRONMENTS = ("development", "test", "production")
# API roles: `read` may call every GET, `admin` everything.
ROLES = ("admin", "read")
TOKEN_ENV = {"admin": "DYGO_ADMIN_TOKEN", "read": "DYGO_READ_TOKEN"}
HOSTS_ENV = "DYGO_ALLOWED_HOSTS"
_HOST_NAME = re.compile(r"^(\*|\.?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?)$")
MIN_TOKEN_LENGTH = 16
_TOKEN_PATTERN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII without spaces: safe in a header


@dataclass(frozen=True)
class Queue:
    name: str
    concurrency: int


RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
_KEY_PATH = re.compile(r"^meta\.([A-Za-z0-9_.-]+)$")
LIMIT_KEYS = ("concurrency_limit", "rate_limit", "key")
MAX_RATE_COUNT = 1_000_000_000  # a PostgreSQL integer holds it; beyond, say "N/s" instead of "N/h"
MAX_CONCURRENCY_LIMIT = 1_000_000


def parse_rate(value: Any) -> tuple[int, float]:
    """A rate limit such as "100/s", "600/m" or "10000/h": (starts, window in seconds)."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f'rate_limit {value!r} must be a count per unit: "100/s", "600/m" or "10000/h"')
    count = int(match.group(1))
    if count <= 0:
        raise ValueError(f"rate_limit {value!r} must allow at least 1 start per window")
    if count > MAX_RATE_COUNT:
        raise ValueError(f"rate_limit {value!r} allows more than {MAX_RATE_COUNT:,} starts per window")
    return count, RATE_UNITS[match.group(2)]


def parse_concurrency_limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"concurrency_limit must be an integer greater than 0, got {value!r}")
    if value > MAX_CONCURRENCY_LIMIT:
        raise ValueError(f"concurrency_limit must be at most {MAX_CONCURRENCY_LIMIT:,}, got {value!r}")
    return value


def parse_limit_key(value: Any) -> str:
    """`key: meta.<field>`: the meta field whose values each get their own limit; returns the field name."""
    match = _KEY_PATH.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"key {value!r} is not a known key path; use meta.<field> (e.g. meta.tenant)")
    return match.group(1)


@dataclass(frozen=True)
class Limit:
    """A cluster-wide limit on a queue or a kind, as declared in config/queues.yml (store/limits.py)."""

    scope: str  # 'queue' or 'kind'
    name: str
    concurrency_limit: int | None = None
    rate_limit: str | None = None  # as written, e.g. "100/s"
    key: str | None = None  # meta field name, e.g. "tenant" for `key: meta.tenant`

    @property
    def rate(self) -> tuple[int, float] | None:
        return parse_rate(self.rate_limit) if self.rate_limit is not None else None


def _limit(source: str, label: str, scope: str, name: str, entry: dict[str, Any]) -> Limit | None:
    """The limit an entry declares (None: none), or a ConfigError naming the entry and the rule."""
    if not any(k in entry for k in LIMIT_KEYS):
        return None
    try:
        concurrency = entry.get("concurrency_limit")
        rate = entry.get("rate_limit")
        if concurrency is None and rate is None:
            raise ValueError("key needs a concurrency_limit or a rate_limit to apply to")
        if concurrency is not None:
            parse_concurrency_limit(concurrency)
        if rate is not None:
            parse_rate(rate)
        key = parse_limit_key(entry["key"]) if entry.get("key") is not None else None
    except ValueError as exc:
        raise ConfigError(source, label, str(exc)) from None
    return Limit(scope, name, concurrency, rate.strip() if rate is not None else None, key)


@dataclass(frozen=True)
class Settings:
    """Everything the store, worker and service read from config, with their defaults."""

    config_dir: Path
    queues: dict[str, Queue]
    env: str = "development"
    # Cluster-wide concurrency and rate limits from config/queues.yml (queue entries and `kinds:`).
    limits: tuple[Limit, ...] = ()
    job_modules: tuple[str, ...] = ("jobs",)
    lease_ttl: float = 30.0
    max_reaps: int = 3
    default_timeout: float = 300.0
    default_max_attempts: int = 20
    claim_batch_size: int = 100
    # A worker claims beyond a queue's free slots what they would run in this many seconds at the pace of its
    # recent jobs (worker/ahead.py); 0 claims only for free slots.
    claim_ahead: float = 0.005
    max_batch_size: int = 1000  # jobs in one POST /api/v1/jobs/batch
    max_payload_bytes: int = 1024 * 1024  # request bodies above this are refused with 413
    max_result_bytes: int = 64 * 1024  # a handler's result above this (as JSON) is stored as a note instead
    # (role, token) pairs for the API, from config/dygo.yml and DYGO_ADMIN_TOKEN / DYGO_READ_TOKEN.
    # Kept out of repr so a logged Settings never shows a token.
    api_tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Host header names `dygo serve` answers besides the address it is bound to (app/guard.py): from
    # config/dygo.yml and DYGO_ALLOWED_HOSTS. `.example.com` is that domain and its subdomains; `*` any.
    allowed_hosts: tuple[str, ...] = ()
    # Wrong tokens from one client address within the window before it is locked out (app/throttle.py).
    failed_token_limit: int = 5
    failed_token_window: float = 300.0
    data_dir: Path = field(default_factory=lambda: Path(".dygo"))
    # Retention, in seconds; 0 keeps those rows forever. Trimmed by workers (store/maintenance.py).
    completed_retention: float = 24 * 3600.0  # succeeded jobs, after they finished
    dead_retention: float = 30 * 86400.0
    cancelled_retention: float = 30 * 86400.0
    stats_retention: float = 90 * 86400.0  # daily stats rows, by their day
    retention_interval: float = 60.0  # how often one worker of the cluster trims
    # Database connections each `dygo serve` process may hold for requests (its LISTEN connection for
    # `?wait=` comes on top): DYGO_SERVE_POOL_SIZE, else serve_pool_size in dygo.yml, else this.
    serve_pool_size: int = 10
    cron: bool = True  # this worker fires due schedules (`cron: false` or `dygo worker --no-cron`: it does not)
    # Per-worker caps (worker/capacity.py): the most jobs of one kind a worker process runs at once, for kinds
    # whose @job sets no concurrency, and the most of all kinds together (--max-concurrency). None: no cap.
    default_concurrency: int | None = None
    max_concurrency: int | None = None

    @property
    def queue_names(self) -> list[str]:
        return list(self.queues)

    @property
    def concurrency(self) -> dict[str, int]:
        """Each configured queue's concurrency, in queues.yml order (what store.admin.list_queues takes)."""
        return {name: queue.concurrency for name, queue in self.queues.items()}


# Keys of config/dygo.yml: name -> (parser, rule shown when it fails)
def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be an integer greater than 0")
    return value


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value, field="value")
    if seconds <= 0:
        raise ValueError("must be a duration greater than 0")
    return seconds


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _duration(value: Any) -> float:
    return parse_duration(value, field="value")


def _retention(value: Any) -> float:
    """How long rows are kept: a duration, or 0 to keep them forever."""
    try:
        return parse_duration(value, field="value")
    except ValueError as exc:
        raise ValueError(f"{exc} (a retention is a duration such as '24h' or '30d', or 0 to keep forever)") from None


def _module_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a module name or a non-empty list of module names")
    return tuple(value)


_BYTE_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}
_BYTE_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def _byte_size(value: Any) -> int:
    """Bytes: an integer, or a number with a unit (B, KB, KiB, MB, MiB), e.g. '1MiB'."""
    if isinstance(value, bool):
        raise ValueError("must be a size like 1048576 or '1MiB'")
    if isinstance(value, int):
        size = value
    else:
        match = _BYTE_SIZE.match(str(value).lower())
        if not match or match.group(2) not in _BYTE_UNITS:
            raise ValueError(f"{value!r} is not a size; use bytes or a unit: B, KB, KiB, MB, MiB (e.g. '1MiB')")
        size = int(match.group(1)) * _BYTE_UNITS[match.group(2)]
    if size <= 0:
        raise ValueError("must be a size greater than 0")
    return size


def _token_list(value: Any, source: str) -> list[str]:
    tokens = [value] if isinstance(value, str) else value
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{source}: must be a token or a list of tokens")
    for token in tokens:
        # The token itself is never put in a message.
        if not isinstance(token, str) or not _TOKEN_PATTERN.match(token):
            raise ValueError(f"{source}: a token must be printable ASCII without spaces")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{source}: a token must be at least {MIN_TOKEN_LENGTH} characters long")
    return tokens


def _host_names(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError("must be a host name or a list of host names")
    for name in names:
        if not _HOST_NAME.match(name.strip().lower()):
            raise ValueError(
                f"{name!r} is not a host name (e.g. jobs.example.com, .example.com for a domain "
                "and its subdomains, or * for any); no scheme, port or path"
            )
    return tuple(name.strip().lower() for name in names)


def hosts_from_env() -> tuple[str, ...]:
    """Host names from DYGO_ALLOWED_HOSTS, comma-separated."""
    raw = [name.strip() for name in os.environ.get(HOSTS_ENV, "").split(",") if name.strip()]
    try:
        return _host_names(raw)
    except ValueError as exc:
        raise ConfigError(HOSTS_ENV, "environment", str(exc)) from None


def _api_tokens(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not value:
        raise ValueError("must map a role (admin, read) to a token or a list of tokens")
    pairs: list[tuple[str, str]] = []
    for role, tokens in value.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        pairs += [(role, token) for token in _token_list(tokens, f"role {role}")]
    return tuple(pairs)


def tokens_from_env() -> tuple[tuple[str, str], ...]:
    """Tokens from DYGO_ADMIN_TOKEN and DYGO_READ_TOKEN (each may hold several, comma-separated)."""
    pairs: list[tuple[str, str]] = []
    for role, variable in TOKEN_ENV.items():
        raw = os.environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            tokens = _token_list([t.strip() for t in raw.split(",") if t.strip()], f"role {role}")
        except ValueError as exc:
            raise ConfigError(variable, "environment", str(exc)) from None
        pairs += [(role, token) for token in tokens]
    return tuple(pairs)


POOL_SIZE_ENV = "DYGO_SERVE_POOL_SIZE"
MIN_SERVE_POOL_SIZE = 2  # one connection for the API's hot paths, one for everything else


def _serve_pool_size(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SERVE_POOL_SIZE:
        raise ValueError(f"must be an integer of at least {MIN_SERVE_POOL_SIZE}, got {value!r}")
    return value


SETTING_PARSERS = {
    "jobs": ("job_modules", _module_list),
    "lease_ttl": ("lease_ttl", _positive_duration),
    "max_reaps": ("max_reaps", _positive_int),
    "default_timeout": ("default_timeout", _duration),
    "default_max_attempts": ("default_max_attempts", _positive_int),
    "claim_batch_size": ("claim_batch_size", _positive_int),
    "claim_ahead": ("claim_ahead", _duration),
    "max_batch_size": ("max_batch_size", _positive_int),
    "max_payload_bytes": ("max_payload_bytes", _byte_size),
    "max_result_bytes": ("max_result_bytes", _byte_size),
    "api_tokens": ("api_tokens", _api_tokens),
    "allowed_hosts": ("allowed_hosts", _host_names),
    "failed_token_limit": ("failed_token_limit", _positive_int),
    "failed_token_window": ("failed_token_window", _positive_duration),
    "completed_retention": ("completed_retention", _retention),
    "dead_retention": ("dead_retention", _retention),
    "cancelled_retention": ("cancelled_retention", _retention),
    "stats_retention": ("stats_retention", _retention),
    "retention_interval": ("retention_interval", _positive_duration),
    "serve_pool_size": ("serve_pool_size", _serve_pool_size),
    "cron": ("cron", _boolean),
    "default_concurrency": ("default_concurrency", _positive_int),
    "max_concurrency": ("max_concurrency", _positive_int),
}


def default_config_dir() -> Path:
    return Path(os.environ.get("DYGO_CONFIG_DIR", "config"))


def resolve_env(flag: str | None = None) -> str:
    env = flag or os.environ.get("DYGO_ENV") or "development"
    if env not in ENVIRONMENTS:
        raise ConfigError("--env", env, f"must be one of {', '.join(ENVIRONMENTS)}")
    return env


def load_settings(config_dir: Path | str | None = None, *, env: str | None = None, queues: bool = True) -> Settings:
    """The settings from `config_dir`. `queues=False`: for commands that run no job (`dygo migrate`),
    config/queues.yml is not read and need not exist (the settings then have no queues)."""
    config_dir = Path(config_dir) if config_dir is not None else default_config_dir()
    configured = load_queues(config_dir / "queues.yml") if queues else {}
    values: dict[str, Any] = {"limits": load_limits(config_dir / "queues.yml") if queues else ()}
    settings_file = config_dir / "dygo.yml"
    if settings_file.exists():
        document = _read_yaml(settings_file)
        if not isinstance(document, dict):
            raise ConfigError(str(settings_file), "top level", "must be a mapping of setting: value")
        for key, raw in document.items():
            if key not in SETTING_PARSERS:
                known = ", ".join(sorted(SETTING_PARSERS))
                raise ConfigError(str(settings_file), str(key), f"unknown setting; known settings: {known}")
            attribute, parse = SETTING_PARSERS[key]
            try:
                values[attribute] = parse(raw)
            except ValueError as exc:
                raise ConfigError(str(settings_file), str(key), str(exc)) from None
    data_dir = Path(os.environ.get("DYGO_DATA_DIR", ".dygo"))
    values["api_tokens"] = values.get("api_tokens", ()) + tokens_from_env()
    values["allowed_hosts"] = values.get("allowed_hosts", ()) + hosts_from_env()
    if os.environ.get(POOL_SIZE_ENV, "").strip():
        try:
            values["serve_pool_size"] = _serve_pool_size(os.environ[POOL_SIZE_ENV].strip())
        except ValueError as exc:
            raise ConfigError(POOL_SIZE_ENV, "environment", str(exc)) from None
    return Settings(config_dir=config_dir, queues=configured, env=resolve_env(env), data_dir=data_dir, **values)


def load_queues(path: Path) -> dict[str, Queue]:
    source = str(path)
    if not path.exists():
        raise ConfigError(
            source, "file", "not found; create it with at least `queues: [{name: default, concurrency: 4}]`"
        )
    document = _read_yaml(path)
    if not isinstance(document, dict) or "queues" not in document or not set(document) <= {"queues", "kinds"}:
        raise ConfigError(source, "top level", "must be a mapping with the key `queues` (and optionally `kinds`)")
    entries = document["queues"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(source, "queues", "must be a non-empty list of {name, concurrency} entries")
    queues: dict[str, Queue] = {}
    for index, entry in enumerate(entries):
        label = f"queues[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(source, label, "must be a mapping with `name` and `concurrency`")
        name = entry.get("name")
        if isinstance(name, str):
            label = f"queues[{index}] ({name})"
        unknown = sorted(set(entry) - {"name", "concurrency", *LIMIT_KEYS})
        if unknown:
            raise ConfigError(
                source,
                label,
                f"unknown key {unknown[0]!r}; allowed keys: name, concurrency, concurrency_limit, rate_limit, key",
            )
        if not isinstance(name, str) or not KEBAB_CASE.match(name):
            raise ConfigError(source, label, f"name {name!r} must be kebab-case (lowercase letters, digits, dashes)")
        concurrency = entry.get("concurrency")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency <= 0:
            raise ConfigError(source, label, f"concurrency must be an integer greater than 0, got {concurrency!r}")
        if name in queues:
            raise ConfigError(source, label, f"queue name {name!r} is already used by an earlier entry")
        queues[name] = Queue(name=name, concurrency=concurrency)
    return queues


def load_limits(path: Path) -> tuple[Limit, ...]:
    """The limits of config/queues.yml: those of queue entries, then `kinds:` entries
    (`- kind: emails.send` with concurrency_limit, rate_limit, key). Whether a kind exists is checked
    where the jobs are loaded (store/limits.py check_kinds)."""
    source = str(path)
    document = _read_yaml(path)
    limits: list[Limit] = []
    for index, entry in enumerate(document["queues"]):
        limit = _limit(source, f"queues[{index}] ({entry['name']})", "queue", entry["name"], entry)
        if limit is not None:
            limits.append(limit)
    kinds = document.get("kinds") or []
    if not isinstance(kinds, list):
        raise ConfigError(source, "kinds", "must be a list of {kind, concurrency_limit, rate_limit, key} entries")
    seen: set[str] = set()
    for index, entry in enumerate(kinds):
        label = f"kinds[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str) or not entry["kind"]:
            raise ConfigError(source, label, "must be a mapping with `kind` (a job kind) and a limit")
        label = f"kinds[{index}] ({entry['kind']})"
        unknown = sorted(set(entry) - {"kind", *LIMIT_KEYS})
        if unknown:
            raise ConfigError(
                source, label, f"unknown key {unknown[0]!r}; allowed keys: kind, concurrency_limit, rate_limit, key"
            )
        if entry["kind"] in seen:
            raise ConfigError(source, label, f"kind {entry['kind']!r} is already limited by an earlier entry")
        seen.add(entry["kind"])
        limit = _limit(source, label, "kind", entry["kind"], entry)
        if limit is None:
            raise ConfigError(source, label, "needs a concurrency_limit or a rate_limit")
        limits.append(limit)
    return tuple(limits)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "syntax", f"not valid YAML: {exc}") from None
