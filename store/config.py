"""Load and validate `config/queues.yml` and the optional `config/dygo.yml`.

Every error names the file, the entry and the rule it breaks, and is raised before any
database work so the CLI can exit 2 with a message a person can act on.

The settings of dygo.yml are declared once, as a pydantic model (`FileSettings`) whose field types are the
rules; the CLI's flags (dygo/cli.py) and the environment variables for the same values take the same types,
and the API's document takes its duration and rate patterns from the same grammars (store/durations.py,
RATE_PATTERN below).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import yaml
from dygo.store.durations import numbers_up_to, parse_duration
from dygo.store.errors import ConfigError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    PlainValidator,
    PositiveInt,
    SkipValidation,
    Strict,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

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
class QueueConfig:
    name: str
    concurrency: int


_KEY_PATH = re.compile(r"meta\.([A-Za-z0-9_.-]+)")
LIMIT_KEYS = ("concurrency_limit", "rate_limit", "rate_burst", "key")  # in the order messages list them
MAX_CONCURRENCY_LIMIT = 1_000_000
MAX_LIMIT_KEY_LENGTH = 255  # `meta.` and the field's name
_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: int() also reads "1_0" and other scripts' digits

# The one rate grammar: a count of starts, a slash and a unit (s, m or h), with optional spaces or tabs around
# each; the count from 1 to MAX_RATE_COUNT. `parse_rate` reads it, RATE_PATTERN is the same language as a
# regular expression (the API's document states it), and tests/test_config.py proves the two agree.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_RATE_COUNT = 1_000_000_000  # a PostgreSQL integer holds it; beyond, say "N/s" instead of "N/h"
_RATE = re.compile(r"^[ \t]*([0-9]+)[ \t]*/[ \t]*([smh])[ \t]*$")
RATE_PATTERN = rf"^[ \t]*0*{numbers_up_to(MAX_RATE_COUNT)}[ \t]*/[ \t]*[smh][ \t]*$"


def parse_rate(value: Any) -> tuple[int, float]:
    """A rate limit such as "100/s", "600/m" or "10000/h": (starts, window in seconds)."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f'rate_limit {value!r} must be a count per unit: "100/s", "600/m" or "10000/h"')
    count = int(match.group(1))
    if count <= 0:
        raise ValueError(f"rate_limit {value!r} must allow at least 1 start per window")
    if count > MAX_RATE_COUNT:
        raise ValueError(f"rate_limit {value!r} allows more than {MAX_RATE_COUNT:,} starts per window")
    return count, RATE_UNITS[match.group(2)]


def parse_concurrency_limit(value: Any) -> int:
    """A concurrency limit: an integer (not a string, not a boolean) from 1 to MAX_CONCURRENCY_LIMIT."""
    return _count("concurrency_limit", value, MAX_CONCURRENCY_LIMIT)


def parse_rate_burst(value: Any, rate_count: int | None) -> int:
    """A rate limit's burst: an integer from 1 to the rate's count (how many starts may come at once)."""
    if rate_count is None:
        raise ValueError("rate_burst needs a rate_limit to apply to")
    burst = _count("rate_burst", value, MAX_RATE_COUNT)
    if burst > rate_count:
        raise ValueError(f"rate_burst must be at most the rate's count ({rate_count:,}), got {burst:,}")
    return burst


def _count(field: str, value: Any, most: int) -> int:
    try:
        count = int(checked(PositiveCount, value))
    except ValueError as exc:
        raise ValueError(f"{field} {exc}, got {value!r}") from None
    if count > most:
        raise ValueError(f"{field} must be at most {most:,}, got {value!r}")
    return count


def count_from_text(field: str, text: str) -> int:
    """A count typed in a form: ASCII digits only (no sign, no '_', no other script's digits)."""
    if len(text) > 12 or not _DIGITS.fullmatch(text):
        raise ValueError(f"{field} {text[:40]!r} must be an integer greater than 0, written in digits 0-9")
    return int(text)


def parse_limit_key(value: Any) -> str:
    """`key: meta.<field>`: the meta field whose values each get their own limit; returns the field name."""
    if isinstance(value, str) and len(value) > MAX_LIMIT_KEY_LENGTH:
        raise ValueError(f"key must be at most {MAX_LIMIT_KEY_LENGTH} characters, got {len(value):,}")
    match = _KEY_PATH.fullmatch(value) if isinstance(value, str) else None
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
    rate_burst: int | None = None  # starts that may come at once after an idle spell (None: 1)

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
        count = parse_rate(rate)[0] if rate is not None else None
        burst = parse_rate_burst(entry["rate_burst"], count) if entry.get("rate_burst") is not None else None
        key = parse_limit_key(entry["key"]) if entry.get("key") is not None else None
    except ValueError as exc:
        raise ConfigError(source, label, str(exc)) from None
    return Limit(scope, name, concurrency, rate.strip() if rate is not None else None, key, burst)


# --- the rules settings, flags and API fields share --------------------------------------------------
# Each rule is an annotated type: what pydantic checks, and a Rule saying it in words. A refusal names the
# rule with the value given ("must be an integer greater than 0, got 0"), whether the value came from
# config/dygo.yml, a flag (dygo/cli.py) or the environment.


@dataclass(frozen=True)
class Rule:
    """What a value must be, in the words every refusal of it uses."""

    text: str


PositiveCount = Annotated[PositiveInt, Strict(), Rule("must be an integer greater than 0")]
MIN_SERVE_POOL_SIZE = 2  # one connection for the API's hot paths, one for everything else
PoolSize = Annotated[
    int, Strict(), Field(ge=MIN_SERVE_POOL_SIZE), Rule(f"must be an integer of at least {MIN_SERVE_POOL_SIZE}")
]
Switch = Annotated[bool, Strict(), Rule("must be true or false")]

_SIZE = Rule("must be a size greater than 0: bytes, or a number with a unit such as KB, KiB, MB or MiB (e.g. '1MiB')")


def _not_a_flag(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{_SIZE.text}, got {value!r}")
    return value


ByteCount = Annotated[ByteSize, BeforeValidator(_not_a_flag), Field(gt=0), AfterValidator(int), _SIZE]


def _duration(value: Any) -> float:
    return parse_duration(value, field="value")


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value, field="value")
    if seconds <= 0:
        raise ValueError(f"must be a duration greater than 0 such as 500ms or 60s, got {value!r}")
    return seconds


def _retention(value: Any) -> float:
    """How long rows are kept: a duration, or 0 to keep them forever."""
    try:
        return parse_duration(value, field="value")
    except ValueError as exc:
        raise ValueError(f"{exc} (a retention is a duration such as '24h' or '30d', or 0 to keep forever)") from None


Duration = Annotated[float, PlainValidator(_duration)]  # store/durations.py's grammar: 0 to a year
PositiveDuration = Annotated[float, PlainValidator(_positive_duration)]
Retention = Annotated[float, PlainValidator(_retention)]


def _module_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a module name or a non-empty list of module names")
    return tuple(value)


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


def _api_tokens(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not value:
        raise ValueError("must map a role (admin, read) to a token or a list of tokens")
    pairs: list[tuple[str, str]] = []
    for role, tokens in value.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        pairs += [(role, token) for token in _token_list(tokens, f"role {role}")]
    return tuple(pairs)


ModuleNames = Annotated[tuple[str, ...], PlainValidator(_module_list)]
HostNames = Annotated[tuple[str, ...], PlainValidator(_host_names)]
# In the file: {role: token or [tokens]}; once loaded, (role, token) pairs.
ApiTokens = Annotated[tuple[tuple[str, str], ...], PlainValidator(_api_tokens)]


def rule_of(annotation: Any) -> Rule | None:
    """The Rule an annotated type carries (inside `X | None` too), if any."""
    if get_origin(annotation) is Annotated:
        found = next((item for item in annotation.__metadata__ if isinstance(item, Rule)), None)
        return found or rule_of(get_args(annotation)[0])
    return next((rule for rule in map(rule_of, get_args(annotation)) if rule is not None), None)


def rule_broken(error: ErrorDetails, rule: Rule | None) -> str:
    """A pydantic error as the rule broken: a validator's own message, else the Rule with the value given."""
    if error["type"] == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if rule is None:
        return error["msg"]
    return f"{rule.text}, got {error['input']!r}"


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def checked(annotation: Any, value: Any) -> Any:
    """`value` validated against an annotated type of this module, or ValueError naming the rule broken."""
    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError as exc:
        raise ValueError(rule_broken(exc.errors()[0], rule_of(annotation))) from None


def checked_text(annotation: Any, text: str) -> Any:
    """`checked` for a value written as text (a flag, an environment variable): "5" is an integer there."""
    try:
        return _adapter(annotation).validate_strings(text)
    except ValidationError as exc:
        raise ValueError(rule_broken(exc.errors()[0], rule_of(annotation))) from None


# --- the settings ----------------------------------------------------------------------------------


class FileSettings(BaseModel):
    """config/dygo.yml: each key with its rule and its default, declared once. `load_settings` checks the file
    against it; the CLI's flags for the same values take the same types (dygo/cli.py); every key has a row in
    docs/reference/configuration.md (tests/test_docs_reference.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    job_modules: ModuleNames = Field(("jobs",), alias="jobs")
    lease_ttl: PositiveDuration = 30.0
    max_reaps: PositiveCount = 3
    default_timeout: Duration = 300.0
    default_max_attempts: PositiveCount = 20
    claim_batch_size: PositiveCount = 100
    # A worker claims beyond a queue's free slots what they would run in this many seconds at the pace of its
    # recent jobs (worker/ahead.py); 0 claims only for free slots.
    claim_ahead: Duration = 0.005
    max_batch_size: PositiveCount = 1000  # jobs in one POST /api/v1/jobs/batch
    max_payload_bytes: ByteCount = ByteSize(1024 * 1024)  # request bodies above this are refused with 413
    max_result_bytes: ByteCount = ByteSize(
        64 * 1024
    )  # a handler's result above this (as JSON) is stored as a note instead
    # A step's result above this (as JSON) fails the step with an error naming it (store/steps.py).
    max_step_result_bytes: ByteCount = ByteSize(1024 * 1024)
    strict_steps: Switch = False  # a replay calling its steps out of the recorded order raises, not warns
    # (role, token) pairs for the API, from config/dygo.yml and DYGO_ADMIN_TOKEN / DYGO_READ_TOKEN.
    # Kept out of repr so a logged Settings never shows a token.
    api_tokens: ApiTokens = Field((), repr=False)
    # Host header names `dygo serve` answers besides the address it is bound to (app/guard.py): from
    # config/dygo.yml and DYGO_ALLOWED_HOSTS. `.example.com` is that domain and its subdomains; `*` any.
    allowed_hosts: HostNames = ()
    # Wrong tokens from one client address within the window before it is locked out (app/throttle.py).
    failed_token_limit: PositiveCount = 5
    failed_token_window: PositiveDuration = 300.0
    # Wrong tokens from all addresses together within the window before tokens from addresses not let in
    # lately are refused unchecked (app/throttle.py).
    failed_token_global_limit: PositiveCount = 100
    # Retention, in seconds; 0 keeps those rows forever. Trimmed by workers (store/maintenance.py).
    completed_retention: Retention = 24 * 3600.0  # succeeded jobs, after they finished
    dead_retention: Retention = 30 * 86400.0
    cancelled_retention: Retention = 30 * 86400.0
    workflow_retention: Retention = 30 * 86400.0  # finished workflows' own rows (their jobs follow the above)
    event_retention: Retention = 7 * 86400.0  # events (store/events.py), after their emit, and waits' placeholders
    stats_retention: Retention = 90 * 86400.0  # daily stats rows, by their day
    retention_interval: PositiveDuration = 60.0  # how often one worker of the cluster trims
    # Database connections each `dygo serve` process may hold for requests (its LISTEN connection for
    # `?wait=` comes on top): DYGO_SERVE_POOL_SIZE, else serve_pool_size in dygo.yml, else this.
    serve_pool_size: PoolSize = 10
    # Slow clients (app/connections.py): a request's headers must arrive within serve_header_timeout of the
    # connection opening (or of the previous response), its body within serve_body_timeout of the headers;
    # each `dygo serve` process holds at most serve_max_connections connections.
    serve_header_timeout: PositiveDuration = 10.0
    serve_body_timeout: PositiveDuration = 30.0
    serve_max_connections: PositiveCount = 1000
    cron: Switch = True  # this worker fires due schedules (`cron: false` or `dygo worker --no-cron`: it does not)
    # Per-worker caps (worker/capacity.py): the most jobs of one kind a worker process runs at once, for kinds
    # whose @job sets no concurrency, and the most of all kinds together (--max-concurrency). None: no cap.
    default_concurrency: PositiveCount | None = None
    max_concurrency: PositiveCount | None = None

    @classmethod
    def from_document(cls, source: str, document: dict[Any, Any]) -> dict[str, Any]:
        """The values a dygo.yml document sets, by field name, or ConfigError naming its first bad key."""
        keys = {field.alias or name: name for name, field in cls.model_fields.items()}
        for key in document:
            if key not in keys:
                raise ConfigError(source, str(key), f"unknown setting; known settings: {', '.join(sorted(keys))}")
        try:
            given = cls.model_validate(document)
        except ValidationError as exc:
            order = list(document)
            error = min(exc.errors(), key=lambda e: order.index(e["loc"][0]) if e["loc"][0] in order else 0)
            key = str(error["loc"][0])
            field = cls.model_fields[keys[key]]
            rule = next((item for item in field.metadata if isinstance(item, Rule)), None) or rule_of(field.annotation)
            raise ConfigError(source, key, rule_broken(error, rule)) from None
        return {keys[key]: getattr(given, keys[key]) for key in document}


SETTING_KEYS = tuple(field.alias or name for name, field in FileSettings.model_fields.items())  # of dygo.yml


class Settings(FileSettings):
    """Everything the store, worker and service read from config, with their defaults: the file's settings,
    and what comes from config/queues.yml, the environment and the command line."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)

    config_dir: SkipValidation[Path]
    queues: SkipValidation[dict[str, QueueConfig]]
    env: str = "development"
    # Cluster-wide concurrency and rate limits from config/queues.yml (queue entries and `kinds:`).
    limits: SkipValidation[tuple[Limit, ...]] = ()
    data_dir: SkipValidation[Path] = Field(default_factory=lambda: Path(".dygo"))

    @property
    def queue_names(self) -> list[str]:
        return list(self.queues)

    @property
    def concurrency(self) -> dict[str, int]:
        """Each configured queue's concurrency, in queues.yml order (what store.admin.list_queues takes)."""
        return {name: queue.concurrency for name, queue in self.queues.items()}


def hosts_from_env() -> tuple[str, ...]:
    """Host names from DYGO_ALLOWED_HOSTS, comma-separated."""
    raw = [name.strip() for name in os.environ.get(HOSTS_ENV, "").split(",") if name.strip()]
    try:
        return _host_names(raw)
    except ValueError as exc:
        raise ConfigError(HOSTS_ENV, "environment", str(exc)) from None


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
        values.update(FileSettings.from_document(str(settings_file), document))
    data_dir = Path(os.environ.get("DYGO_DATA_DIR", ".dygo"))
    values["api_tokens"] = values.get("api_tokens", ()) + tokens_from_env()
    values["allowed_hosts"] = values.get("allowed_hosts", ()) + hosts_from_env()
    if os.environ.get(POOL_SIZE_ENV, "").strip():
        try:
            values["serve_pool_size"] = checked_text(PoolSize, os.environ[POOL_SIZE_ENV].strip())
        except ValueError as exc:
            raise ConfigError(POOL_SIZE_ENV, "environment", str(exc)) from None
    # Every value is checked by now: the settings are put together without checking them again.
    return Settings.model_construct(
        config_dir=config_dir, queues=configured, env=resolve_env(env), data_dir=data_dir, **values
    )


def load_queues(path: Path) -> dict[str, QueueConfig]:
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
    queues: dict[str, QueueConfig] = {}
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
                f"unknown key {unknown[0]!r}; allowed keys: name, concurrency, {', '.join(LIMIT_KEYS)}",
            )
        if not isinstance(name, str) or not KEBAB_CASE.match(name):
            raise ConfigError(source, label, f"name {name!r} must be kebab-case (lowercase letters, digits, dashes)")
        try:
            concurrency = checked(PositiveCount, entry.get("concurrency"))
        except ValueError as exc:
            raise ConfigError(source, label, f"concurrency {exc}") from None
        if name in queues:
            raise ConfigError(source, label, f"queue name {name!r} is already used by an earlier entry")
        queues[name] = QueueConfig(name=name, concurrency=concurrency)
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
        raise ConfigError(source, "kinds", f"must be a list of {{kind, {', '.join(LIMIT_KEYS)}}} entries")
    seen: set[str] = set()
    for index, entry in enumerate(kinds):
        label = f"kinds[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str) or not entry["kind"]:
            raise ConfigError(source, label, "must be a mapping with `kind` (a job kind) and a limit")
        label = f"kinds[{index}] ({entry['kind']})"
        unknown = sorted(set(entry) - {"kind", *LIMIT_KEYS})
        if unknown:
            raise ConfigError(source, label, f"unknown key {unknown[0]!r}; allowed keys: kind, {', '.join(LIMIT_KEYS)}")
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
