"""OpenTelemetry traces across the queue, when the optional `otel` extra is installed.

Without opentelemetry-api every function here does nothing, and so it does while no TracerProvider
is configured (dygo never configures one: that is the application's call, e.g. with the SDK or
`opentelemetry-instrument`). With one:

* enqueue (Python API and HTTP) runs in a `dygo.enqueue` span, and the job's meta carries that
  span's W3C trace context (`traceparent`, plus `tracestate`/`baggage` when set);
* the worker runs each handler in a `dygo.execute <kind>` span whose parent is that context, so
  the trace goes from the enqueuer through the queue into the handler, across processes;
* a worker fires each due cron occurrence in a `dygo.schedule.fire` span (the root of a trace: a
  fire has no caller) around that enqueue, so the fired job's handler runs in the fire's trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the `otel` extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from dygo.store.leases import ClaimedJob

TRACER = "dygo"


def active() -> bool:
    """True when OpenTelemetry is installed and the application configured a TracerProvider."""
    if trace is None:  # type: ignore[comparison-overlap, unused-ignore]
        return False  # type: ignore[unreachable, unused-ignore]
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


@contextmanager
def enqueue_span(**attributes: Any) -> Iterator[Any]:
    """The `dygo.enqueue` span around one enqueue or one batch (None when tracing is off)."""
    if not active():
        yield None
        return
    with trace.get_tracer(TRACER).start_as_current_span(
        "dygo.enqueue", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield span


def carrier() -> dict[str, str]:
    """The current span's trace context as meta entries (`traceparent`...); empty when no span is current."""
    entries: dict[str, str] = {}
    if active() and trace.get_current_span().get_span_context().is_valid:
        propagate.inject(entries)
    return entries


def set_attributes(span: Any, **attributes: Any) -> None:
    if span is not None:
        span.set_attributes(
            {f"dygo.{name.replace('_', '.')}": value for name, value in attributes.items() if value is not None}
        )


@contextmanager
def incoming(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the caller's trace context (a `traceparent` request header) current for the block."""
    if not active() or "traceparent" not in headers:
        yield
        return
    token = otel_context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def execution_span(job: ClaimedJob) -> Iterator[Any]:
    """The handler's `dygo.execute <kind>` span, a child of the enqueue span whose context is in the meta."""
    if not active():
        yield None
        return
    parent = propagate.extract(job.meta) if job.meta else None
    attributes: dict[str, str | int] = {
        "dygo.job.id": job.id,
        "dygo.job.kind": job.kind,
        "dygo.job.queue": job.queue,
        "dygo.job.attempt": job.attempt,
    }
    with trace.get_tracer(TRACER).start_as_current_span(
        f"dygo.execute {job.kind}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def schedule_fire_span(name: str, occurrence: datetime, kind: str) -> Iterator[Any]:
    """The `dygo.schedule.fire` span around firing one occurrence (None when tracing is off). The job it
    enqueues carries the context of its `dygo.enqueue` span, a child of this one."""
    if not active():
        yield None
        return
    attributes = {
        "dygo.schedule.name": name,
        "dygo.schedule.occurrence": occurrence.astimezone(UTC).isoformat(),
        "dygo.job.kind": kind,
    }
    with trace.get_tracer(TRACER).start_as_current_span("dygo.schedule.fire", attributes=attributes) as span:
        yield span


def record_fire(span: Any, outcome: str, job_id: int | None, error: str | None) -> None:
    """What a fire did (fired, deduplicated, skipped, error) and the job it enqueued, on its span."""
    if span is None:
        return
    set_attributes(span, job_id=job_id, schedule_outcome=outcome)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))


def record_outcome(span: Any, outcome: str, error: str | None) -> None:
    """The execution's outcome (succeeded, failed, snoozed, dead) on its span; an error status if it failed."""
    if span is None:
        return
    span.set_attribute("dygo.job.outcome", outcome)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))


def record_exception(exc: BaseException) -> None:
    """Record what a handler raised on the current (execution) span."""
    if active():
        trace.get_current_span().record_exception(exc)
