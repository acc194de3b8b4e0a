"""The @job decorator, the registry, the handler context and its test helper."""

from __future__ import annotations

import asyncio

import pytest
from dygo.store import make_context
from dygo.store.config import QueueConfig, Settings
from dygo.store.errors import ConfigError, EnqueueError
from dygo.store.registry import Registry, job
from pydantic import BaseModel


def settings_with(*names: str) -> Settings:
    from pathlib import Path

    return Settings(config_dir=Path("config"), queues={n: QueueConfig(n, 1) for n in names})


def test_duplicate_kind_fails_loudly():
    jobs = Registry()

    @job("dup.kind", registry=jobs)
    async def first(ctx, args: dict) -> None: ...

    with pytest.raises(ConfigError, match="already registered by .*first"):

        @job("dup.kind", registry=jobs)
        async def second(ctx, args: dict) -> None: ...


def test_job_naming_an_unknown_queue_is_invalid_at_load():
    jobs = Registry()

    @job("mail.send", queue="email", registry=jobs)
    async def send(ctx, args: dict) -> None: ...

    with pytest.raises(ConfigError, match="queue 'email' is not registered"):
        jobs.check_queues(settings_with("default"))
    jobs.check_queues(settings_with("default", "email"))


def test_registration_after_the_worker_starts_fails():
    jobs = Registry()
    jobs.freeze()
    with pytest.raises(ConfigError, match="before the worker starts"):

        @job("late.kind", registry=jobs)
        async def late(ctx, args: dict) -> None: ...


@pytest.mark.parametrize("kwargs", [{"timeout": "forever"}, {"max_attempts": 0}, {"retry_backoff": "-1s"}])
def test_bad_job_options_are_rejected(kwargs):
    with pytest.raises(ConfigError):
        job("bad.options", registry=Registry(), **kwargs)(lambda ctx, args: None)


def test_bad_kind_name_is_rejected():
    with pytest.raises(ConfigError, match="dotted name"):
        job("has spaces", registry=Registry())(lambda ctx, args: None)


class Email(BaseModel):
    to: str
    retries: int = 0


def test_pydantic_args_are_validated_and_built():
    jobs = Registry()

    @job("email.send", registry=jobs)
    async def send(ctx, args: Email) -> str:
        return f"{ctx.kind} to {args.to} attempt {ctx.attempt}"

    definition = jobs.get("email.send")
    assert definition.args_model is Email
    assert definition.validate_args({"to": "a@b.c"}) == {"to": "a@b.c", "retries": 0}
    with pytest.raises(EnqueueError) as caught:
        definition.validate_args({"retries": "many"})
    assert caught.value.code == "invalid_args"
    assert {tuple(e["loc"]) for e in caught.value.details} == {("to",), ("retries",)}

    ctx = make_context("email.send", attempt=2)
    result = asyncio.run(send(ctx, definition.build_args({"to": "x@y.z"})))
    assert result == "email.send to x@y.z attempt 2"
    assert ctx.is_retry


def test_sync_and_async_handlers_are_told_apart():
    jobs = Registry()

    @job("a.sync", registry=jobs)
    def sync_handler(ctx, args: dict) -> None: ...

    @job("a.async", registry=jobs)
    async def async_handler(ctx, args: dict) -> None: ...

    assert not jobs.get("a.sync").is_async
    assert jobs.get("a.async").is_async


def test_unresolvable_args_annotation_fails_at_definition():
    class Local(BaseModel):
        x: int

    with pytest.raises(ConfigError, match="cannot resolve the args annotation"):

        @job("local.model", registry=Registry())
        async def handler(ctx, args: Local) -> None: ...


def test_make_context_builds_a_context_for_tests():
    ctx = make_context("report.build", attempt=1, meta={"tenant": "acme"})
    assert (ctx.kind, ctx.attempt, ctx.is_retry, ctx.meta["tenant"]) == ("report.build", 1, False, "acme")


def test_a_context_missing_a_field_is_a_type_error_when_it_is_made_and_a_made_one_is_frozen():
    from datetime import UTC, datetime

    from dygo.store.registry import JobContext

    required = {
        "id": 7,
        "kind": "report.build",
        "queue": "default",
        "attempt": 2,
        "max_attempts": 5,
        "enqueued_at": datetime.now(UTC),
    }
    for name in required:
        with pytest.raises(TypeError, match=name):
            JobContext(**{key: value for key, value in required.items() if key != name})
    ctx = JobContext(**required, lease_token="t", reporter=print)
    assert ctx.is_retry and ctx.meta == {} and ctx.deadline is None and ctx.reporter is print
    with pytest.raises(AttributeError):
        ctx.attempt = 3  # frozen
