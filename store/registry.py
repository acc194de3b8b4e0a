"""Job definitions: the `@job` decorator, the registry both processes import, and the handler context."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from dygo.store.config import Settings
from dygo.store.durations import parse_duration
from dygo.store.errors import ConfigError, EnqueueError
from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    import psycopg
    from dygo.store.job_handle import Job
    from dygo.store.leases import BatchAppend
    from dygo.store.steps import Steps
    from dygo.store.workflows import Dep, NodeOf

KIND_PATTERN = re.compile(r"^[A-Za-z0-9_]+(?:[.\-][A-Za-z0-9_]+)*$")
# A kind is a label of metrics, logs and the dashboard, kept for the stats' whole retention: a short name.
MAX_KIND_LENGTH = 200
DEFAULT_QUEUE = "default"
MAX_PROGRESS_MESSAGE = 1000  # characters kept of a progress message


@dataclass(frozen=True)
class JobContext:
    """What a handler knows about the job it runs. Build one in tests with `make_context`. The worker builds
    it with the constructor, so a field it does not pass is a TypeError when the job starts, never an
    AttributeError inside a handler."""

    id: int
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    meta: Mapping[str, str] = field(default_factory=dict)
    deadline: datetime | None = None
    # This run's lease: a fencing token for downstream writes (accept one only from the newest lease).
    lease_token: str | None = None
    # Set by the worker; receives (lease token, fraction, message). None in `make_context` contexts.
    reporter: Callable[[str, float, str | None], None] | None = field(default=None, repr=False, compare=False)
    # A job of a workflow: its node, and each node its node runs after, by name (store/workflows.py).
    workflow: NodeOf | None = None
    deps: Mapping[str, Dep] = field(default_factory=dict)
    # Jobs this run adds to its open batch, written by the settle of its success (`add_to_batch`).
    appends: list[BatchAppend] = field(default_factory=list, repr=False, compare=False)
    # This run's durable steps (store/steps.py), set by the worker. None in `make_context` contexts: a step
    # then just runs its function, recording nothing.
    steps: Steps | None = field(default=None, repr=False, compare=False)

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    def add_to_batch(self, kind: str, args: Sequence[Any], **options: Any) -> None:
        """Add one job of `kind` per element of `args` to this job's own batch, which must be open. They are
        written in the transaction that records this run's success, and only then: a run that fails or loses
        its lease adds nothing (its retry adds them again). `options` are `enqueue`'s. Validated now: a bad
        job raises EnqueueError here."""
        from dygo.store.enqueue import JobRequest, prepare, rows_json
        from dygo.store.leases import BatchAppend

        if self.workflow is None:
            raise ValueError(f"ctx.add_to_batch: job {self.id} is not part of a batch")
        rows = [prepare(JobRequest(kind, member, **options)) for member in args]
        if rows:
            self.appends.append(BatchAppend(self.workflow.workflow_id, rows_json(rows), len(rows)))

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` (sync or async) once for this job across its attempts, as the step
        `name#n` (its n-th call of `name` in this run): its JSON result is recorded when it returns, and a
        later attempt gets the recorded result without running it. At least once: a worker that dies after
        `fn`'s effect and before the record runs it again. Returns the result as JSON decodes it."""
        if self.steps is None:
            return await _awaited(fn(*args, **kwargs))
        return await self.steps.step(name, fn, args, kwargs)

    async def step_tx(self, name: str, fn: Callable[[psycopg.AsyncConnection[Any]], Any], /) -> Any:
        """`step`, with `fn(conn)` run inside the transaction that records the step and checks this run's
        lease: what `fn` does through `conn` commits with the step, exactly once. Keep it short: it holds
        the worker's shared connection."""
        if self.steps is None:
            raise RuntimeError("ctx.step_tx needs a worker's database connection; this context has none")
        return await self.steps.step_tx(name, fn)

    def step_sync(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step` for a sync handler (`def`, run in its own thread): `fn` must be a plain function."""
        if self.steps is None:
            return fn(*args, **kwargs)
        return self.steps.step_sync(name, fn, args, kwargs)

    def step_tx_sync(self, name: str, fn: Callable[[psycopg.Connection[Any]], Any], /) -> Any:
        """`step_tx` for a sync handler: `fn(conn)` gets a sync connection, in the step's transaction."""
        if self.steps is None:
            raise RuntimeError("ctx.step_tx_sync needs a worker's database connection; this context has none")
        return self.steps.step_tx_sync(name, fn)

    async def sleep(self, name: str, duration: str | float | timedelta, /) -> None:
        """Sleep `duration` ("1d", "90s", seconds or a timedelta) as the step `name#n`, without holding a
        slot: the first run records the wake time and ends (the job waits pending, its attempt not spent); the
        run after the wake time replays the steps before it and goes on from here. Let the Sleeping exception
        it raises through."""
        if self.steps is None:
            raise RuntimeError("ctx.sleep needs a worker's database connection; this context has none")
        await self.steps.sleep(name, duration)

    def sleep_sync(self, name: str, duration: str | float | timedelta, /) -> None:
        """`sleep` for a sync handler (`def`, run in its own thread)."""
        if self.steps is None:
            raise RuntimeError("ctx.sleep_sync needs a worker's database connection; this context has none")
        self.steps.sleep_sync(name, duration)

    # -- child jobs (store/children.py)

    async def call(self, name: str, kind: str | Handler, args: Any = None, /, **options: Any) -> Any:
        """Run one child job of `kind` (a kind's name or its @job handler) with `args` as the step `name#n`,
        and return its result. The parent leaves its slot and waits (its attempt not spent) until the child
        ends; the child is enqueued by the settle that commits that wait. `options` are `enqueue`'s (queue,
        priority, delay, max_attempts, meta), validated now: a bad job raises EnqueueError here. ChildFailed
        if the child ends dead or cancelled, or is deleted first. Let the Suspended exception through."""
        from dygo.store.children import call

        return await call(self._child_steps("call"), name, kind, args, options)

    async def map(self, name: str, kind: str | Handler, args: Sequence[Any], /, **options: Any) -> list[Any]:
        """`call` for one child job per element of `args`, all enqueued together: their results in the order
        of `args` once every child has ended ([] at once for an empty list). ChildFailed, with the results of
        the children that succeeded, when any did not."""
        from dygo.store.children import map_jobs

        return await map_jobs(self._child_steps("map"), name, kind, args, options)

    def call_sync(self, name: str, kind: str | Handler, args: Any = None, /, **options: Any) -> Any:
        """`call` for a sync handler (`def`, run in its own thread)."""
        from dygo.store.children import call_sync

        return call_sync(self._child_steps("call_sync"), name, kind, args, options)

    def map_sync(self, name: str, kind: str | Handler, args: Sequence[Any], /, **options: Any) -> list[Any]:
        """`map` for a sync handler (`def`, run in its own thread)."""
        from dygo.store.children import map_sync

        return map_sync(self._child_steps("map_sync"), name, kind, args, options)

    def _child_steps(self, method: str) -> Steps:
        if self.steps is None:
            raise RuntimeError(f"ctx.{method} needs a worker's database connection; this context has none")
        return self.steps

    # -- events (store/events.py)

    async def wait_for_event(self, name: str, /, *, key: str, timeout: str | float | timedelta | None = None) -> Any:
        """Wait, as the step `name#n`, until the event `key` is emitted (`dygo.emit`, the API, a callback URL),
        without holding a slot: returns its payload (as JSON decodes it), at once if it was emitted before.
        Until then the job is `waiting` (its attempt not spent). EventTimeout, which the handler may catch,
        when `timeout` ("3d", seconds, a timedelta; None: none) passes first. Let Suspended through."""
        if self.steps is None:
            raise RuntimeError("ctx.wait_for_event needs a worker's database connection; this context has none")
        from dygo.store.events import wait_for_event

        return await wait_for_event(self.steps, name, key, timeout)

    def wait_for_event_sync(self, name: str, /, *, key: str, timeout: str | float | timedelta | None = None) -> Any:
        """`wait_for_event` for a sync handler (`def`, run in its own thread)."""
        if self.steps is None:
            raise RuntimeError("ctx.wait_for_event_sync needs a worker's database connection; this context has none")
        from dygo.store.events import wait_for_event

        steps = self.steps
        steps._not_on_loop("wait_for_event_sync", "await ctx.wait_for_event(...)")
        return steps._on_loop(wait_for_event(steps, name, key, timeout))

    def callback_url(self, key: str, base_url: str = "") -> str:
        """A URL that emits the event `key` when POSTed to, with no API token (store.events.callback_url)."""
        from dygo.store.events import callback_url

        return callback_url(key, base_url)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job is, 0 to 1, with an optional message. Cheap to call often: the
        worker keeps the latest value and writes it at most once a second (API and dashboard show it)."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
            raise ValueError(
                f"ctx.progress: fraction must be a number from 0 to 1 (0.25 = a quarter done), got {fraction!r}"
            )
        if message is not None and not isinstance(message, str):
            raise ValueError(f"ctx.progress: message must be a string or None, got {type(message).__name__}")
        if self.reporter is not None and self.lease_token is not None:
            short = None if message is None else message[:MAX_PROGRESS_MESSAGE]
            self.reporter(self.lease_token, float(fraction), short)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def make_context(kind: str = "test.job", **overrides: Any) -> JobContext:
    """A context for calling a handler directly in a test, without a worker or database."""
    from datetime import UTC

    values: dict[str, Any] = {
        "id": 1,
        "kind": kind,
        "queue": DEFAULT_QUEUE,
        "attempt": 1,
        "max_attempts": 20,
        "enqueued_at": datetime.now(UTC),
        "meta": {},
        "deadline": None,
    }
    values.update(overrides)
    return JobContext(**values)


Handler = Callable[[JobContext, Any], Any]
A = TypeVar("A")  # a handler's args type, carried to the Job `@job` returns
R = TypeVar("R")  # a handler's return type


@dataclass(frozen=True)
class JobDefinition:
    kind: str
    handler: Handler
    queue: str | None  # None: the `default` queue
    timeout: float | None  # seconds; None: the configured default; 0: no deadline
    max_attempts: int | None  # None: the configured default
    priority: int
    retry_backoff: float  # seconds before the first retry; doubles each attempt
    args_model: type[BaseModel] | None
    is_async: bool
    cron: str | None = None  # `@job(..., cron=...)`: a schedule named after the kind (store.schedules)
    cron_timezone: str = "UTC"
    concurrency: int | None = None  # most of this kind one worker process runs at once; None: default_concurrency

    @property
    def queue_name(self) -> str:
        return self.queue or DEFAULT_QUEUE

    def validate_args(self, args: Any) -> dict[str, Any]:
        """The JSON-ready args for storage, validated against the kind's model when it has one."""
        if self.args_model is not None:
            if isinstance(args, self.args_model):
                return args.model_dump(mode="json")
            try:
                return self.args_model.model_validate(args or {}).model_dump(mode="json")
            except ValidationError as exc:
                details = exc.errors(include_url=False, include_context=False, include_input=False)
                raise EnqueueError("invalid_args", f"args for kind {self.kind!r} are invalid", details) from None
        if isinstance(args, BaseModel):
            return args.model_dump(mode="json")
        if args is None:
            return {}
        if not isinstance(args, dict):
            raise EnqueueError("invalid_args", f"args for kind {self.kind!r} must be a JSON object")
        return args

    def build_args(self, stored: dict[str, Any]) -> Any:
        """What the handler receives: its model instance, or the stored dict."""
        if self.args_model is not None:
            return self.args_model.model_validate(stored)
        return stored


class Registry:
    """Kinds known to this process. Frozen once a worker starts: late registration is a bug."""

    def __init__(self) -> None:
        self._definitions: dict[str, JobDefinition] = {}
        self._frozen = False
        # Set by `load_jobs`, else read from queues.yml at the first enqueue (configured_queues).
        self.queues: list[str] | None = None
        self.default_max_attempts = 20
        self._attempts: tuple[str, int] | None = None  # max_attempts_at_claim, built once per change
        # Validated cron schedules by name, filled by `load_jobs` (store.schedules.Schedule values).
        self.schedules: dict[str, Any] = {}

    def add(self, definition: JobDefinition) -> None:
        source = getattr(definition.handler, "__module__", "?")
        if self._frozen:
            raise ConfigError(source, definition.kind, "jobs must be registered before the worker starts")
        if definition.kind in self._definitions:
            other = self._definitions[definition.kind].handler
            raise ConfigError(
                source,
                definition.kind,
                f"kind is already registered by {other.__module__}.{other.__qualname__}; kinds must be unique",
            )
        self._definitions[definition.kind] = definition
        self._attempts = None

    def get(self, kind: str) -> JobDefinition | None:
        return self._definitions.get(kind)

    def __iter__(self) -> Iterator[JobDefinition]:
        return iter(self._definitions.values())

    def __len__(self) -> int:
        return len(self._definitions)

    def kinds(self) -> list[str]:
        return sorted(self._definitions)

    def freeze(self) -> None:
        self._frozen = True

    def concurrency_caps(self, default: int | None) -> dict[str, int]:
        """Kind -> the most of it one worker process runs at once: its `@job(concurrency=...)`, else `default`
        (default_concurrency); kinds with neither are left out (no cap)."""
        caps = {d.kind: d.concurrency if d.concurrency is not None else default for d in self._definitions.values()}
        return {kind: cap for kind, cap in caps.items() if cap is not None}

    def max_attempts_at_claim(self) -> tuple[str, int]:
        """What a claim gives a job enqueued without max_attempts: (JSON object kind -> the registration's
        max_attempts, for the kinds that set one; the configured default)."""
        if self._attempts is None or self._attempts[1] != self.default_max_attempts:
            by_kind = {d.kind: d.max_attempts for d in self._definitions.values() if d.max_attempts is not None}
            self._attempts = (json.dumps(by_kind), self.default_max_attempts)
        return self._attempts

    def configured_queues(self) -> list[str]:
        """The configured queue names: those `load_jobs` set, else read once from queues.yml in
        $DYGO_CONFIG_DIR (default `config`), so that a producer which never loaded the configuration still
        enqueues only to queues a worker can run. EnqueueError when there is no such file to read."""
        if self.queues is None:
            from dygo.store.config import default_config_dir, load_queues

            try:
                self.queues = list(load_queues(default_config_dir() / "queues.yml"))
            except ConfigError as exc:
                raise EnqueueError(
                    "queues_unknown",
                    f"cannot check the job's queue against the configured queues ({exc}): load "
                    "the configuration first (dygo.store.loading.load_jobs(dygo.store.config.load_settings())), or set "
                    "DYGO_CONFIG_DIR to the folder holding queues.yml",
                    {"field": "queue"},
                ) from None
        return self.queues

    def check_queues(self, settings: Settings) -> None:
        for definition in self:
            if definition.queue_name not in settings.queues:
                rule = (
                    "omits its queue, so queue 'default' must exist in queues.yml"
                    if definition.queue is None
                    else f"queue {definition.queue!r} is not registered in queues.yml"
                )
                raise ConfigError(definition.handler.__module__, f"job {definition.kind!r}", rule)


registry = Registry()


def job(
    kind: str,
    *,
    queue: str | None = None,
    timeout: str | float | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    retry_backoff: str | float = "15s",
    cron: str | None = None,
    timezone: str = "UTC",
    concurrency: int | None = None,
    registry: Registry = registry,
) -> Callable[[Callable[[JobContext, A], R]], Job[A, R]]:
    """Declare a handler for `kind`. Handlers take `(ctx, args)` and may be `async def` or plain `def`.

    Returns a `Job` (store/job_handle.py): the handler, still callable as itself, with `enqueue`,
    `aenqueue`, `enqueue_many` and `aenqueue_many` for its kind, their `args` typed as the handler's.

    `cron` (with `timezone`) also schedules the kind, with default args, under the kind's name; use
    `store.schedules.schedule` for args or other options. Both are validated when the jobs load.
    `concurrency` caps how many jobs of the kind one worker process runs at once (default:
    `default_concurrency` in config/dygo.yml, else no cap)."""

    def decorate(handler: Callable[[JobContext, A], R]) -> Job[A, R]:
        from dygo.store.job_handle import Job

        source = getattr(handler, "__module__", "?")
        if not isinstance(kind, str) or not KIND_PATTERN.match(kind) or len(kind) > MAX_KIND_LENGTH:
            raise ConfigError(
                source,
                f"job {kind!r}",
                f"kind must be a dotted name like 'email.send' of at most {MAX_KIND_LENGTH} characters",
            )
        if queue is not None and not isinstance(queue, str):
            raise ConfigError(source, f"job {kind!r}", "queue must be a queue name")
        if max_attempts is not None and (isinstance(max_attempts, bool) or max_attempts < 1):
            raise ConfigError(source, f"job {kind!r}", "max_attempts must be an integer of at least 1")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigError(
                source, f"job {kind!r}", f"concurrency must be an integer of at least 1, got {concurrency!r}"
            )
        try:
            timeout_s = None if timeout is None else parse_duration(timeout, field="timeout")
            backoff_s = parse_duration(retry_backoff, field="retry_backoff")
        except ValueError as exc:
            raise ConfigError(source, f"job {kind!r}", str(exc)) from None
        definition = JobDefinition(
            kind=kind,
            handler=handler,
            queue=queue,
            timeout=timeout_s,
            max_attempts=max_attempts,
            priority=priority,
            retry_backoff=backoff_s,
            args_model=_args_model(handler),
            is_async=inspect.iscoroutinefunction(handler),
            cron=cron,
            cron_timezone=timezone,
            concurrency=concurrency,
        )
        registry.add(definition)
        return Job(definition, handler)

    return decorate


def _args_model(handler: Handler) -> type[BaseModel] | None:
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) != 2:
        raise ConfigError(handler.__module__, handler.__qualname__, "a handler takes exactly (ctx, args)")
    try:
        hint = get_type_hints(handler).get(parameters[1].name)
    except NameError as exc:
        raise ConfigError(
            handler.__module__,
            handler.__qualname__,
            f"cannot resolve the args annotation ({exc}); define the model at module level",
        ) from None
    if inspect.isclass(hint) and issubclass(hint, BaseModel):
        return hint
    return None
