"""The OpenAPI document: FastAPI's, plus each registered kind's args and the bearer scheme.

The enqueue endpoints validate with the generic EnqueueRequest (so an unknown kind gets its own
error code, and kinds registered only in other codebases' workers can still be enqueued with a
queue). The document, though, describes a job as `anyOf` one variant per registered kind — its
`kind` a constant, its `args` that kind's pydantic model — or the generic form. The variants are
pydantic models built at start-up, so their JSON schema is exactly what validation enforces.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from dygo.app.auth import PROTECTED_PREFIX, signed
from dygo.app.schemas import EnqueueOptions
from dygo.store.registry import Registry
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import models_json_schema

# Components for the kinds get this prefix, so no args model can shadow one of the API's own.
KIND_PREFIX = "kind."


def kind_variants(jobs: Registry) -> list[type[BaseModel]]:
    variants: list[type[BaseModel]] = []
    for definition in sorted(jobs, key=lambda d: d.kind):
        args_type: Any = definition.args_model or dict[str, Any]
        doc = (definition.handler.__doc__ or "").strip() or f"Enqueue a {definition.kind} job."
        variants.append(
            create_model(
                "Enqueue_" + re.sub(r"[^A-Za-z0-9]", "_", definition.kind),
                __base__=EnqueueOptions,
                __doc__=doc,
                # A Literal of a runtime value: what the document shows, though no static type can name it.
                kind=(Literal[definition.kind], Field(description=f"Queue by default: {definition.queue_name}")),  # type: ignore[arg-type]
                # Optional only when the model takes {} (what the server assumes for missing args).
                args=(args_type, Field(...) if _needs_args(definition.args_model) else Field(default_factory=dict)),
            )
        )
    return variants


def _needs_args(model: type[BaseModel] | None) -> bool:
    return model is not None and any(field.is_required() for field in model.model_fields.values())


def _kind_schemas(jobs: Registry) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """$refs to the variants, and the components they need."""
    variants = kind_variants(jobs)
    if not variants:
        return [], {}
    refs, document = models_json_schema(
        [(model, "validation") for model in variants], ref_template=f"#/components/schemas/{KIND_PREFIX}{{model}}"
    )
    components = {KIND_PREFIX + name: schema for name, schema in document.get("$defs", {}).items()}
    return [refs[(model, "validation")] for model in variants], components


def install_openapi(app: FastAPI, jobs: Registry) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        variants, components = _kind_schemas(jobs)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(components)
        _declare_queues(schemas, components, app.state.settings.queue_names)
        _declare_option_rules(
            [
                schemas["EnqueueRequest"],
                *(component for name, component in components.items() if name.startswith(KIND_PREFIX + "Enqueue_")),
            ]
        )
        _declare_workflow_jobs(schemas, app.state.settings.queue_names)
        one_job = {"anyOf": [*variants, {"$ref": "#/components/schemas/EnqueueRequest"}]}
        body = schema["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
        body["schema"] = one_job
        schemas["BatchRequest"]["properties"]["jobs"]["items"] = one_job
        if app.state.authenticate is None:  # otherwise the application's own sign-in applies (app/mounting.py)
            _declare_bearer(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _declare_queues(schemas: dict[str, Any], variants: dict[str, Any], queues: list[str]) -> None:
    """A job's queue is one of the configured queues; the generic form (a kind this service may not know)
    must name it, as the server requires (unknown_kind otherwise)."""
    configured = {"type": "string", "enum": queues}
    for name, component in variants.items():
        if name.startswith(KIND_PREFIX + "Enqueue_") and "queue" in component.get("properties", {}):
            component["properties"]["queue"] = {
                **component["properties"]["queue"],
                "anyOf": [configured, {"type": "null"}],
            }
    generic = schemas["EnqueueRequest"]
    described = {key: value for key, value in generic["properties"]["queue"].items() if key in ("title", "description")}
    generic["properties"]["queue"] = {**described, **configured}
    generic["required"] = sorted({*generic.get("required", []), "kind", "queue"})
    # A registered kind is described by its variant, whose args are that kind's model; the generic form,
    # whose args are any object, is for the kinds this service does not know.
    registered = [
        variant["properties"]["kind"]["const"]
        for variant in variants.values()
        if "kind" in variant.get("properties", {}) and "const" in variant["properties"]["kind"]
    ]
    if registered:
        generic["properties"]["kind"] = {**generic["properties"]["kind"], "not": {"enum": sorted(registered)}}


# Rules between a job's options that the store enforces (invalid_option): run_at and delay not both
# (null counts as absent), and idempotency_ttl only with an idempotency_key.
OPTION_RULES = [
    {
        "if": {"properties": {"run_at": {"type": "string"}}, "required": ["run_at"]},
        "then": {"properties": {"delay": {"type": "null"}}},
    },
    {
        "if": {"properties": {"idempotency_ttl": {"type": ["string", "number"]}}, "required": ["idempotency_ttl"]},
        "then": {"properties": {"idempotency_key": {"type": "string"}}, "required": ["idempotency_key"]},
    },
]


# The bodies of app/workflows.py that carry job options (JobOptions: no idempotency option of their own).
WORKFLOW_JOBS = ("WorkflowNodeRequest", "WorkflowBatchRequest", "BatchJobsRequest")


def _declare_workflow_jobs(schemas: dict[str, Any], queues: list[str]) -> None:
    """A workflow's jobs take the options of an enqueue, and the same rules: a configured queue, not
    run_at and delay both."""
    for name in WORKFLOW_JOBS:
        component = schemas.get(name)
        if component is None:
            continue
        queue = component["properties"]["queue"]
        component["properties"]["queue"] = {
            **queue,
            "anyOf": [{"type": "string", "enum": queues}, {"type": "null"}],
        }
        component["allOf"] = [*component.get("allOf", []), OPTION_RULES[0]]


def _declare_option_rules(jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        job["allOf"] = [*job.get("allOf", []), *OPTION_RULES]


def _declare_bearer(schema: dict[str, Any]) -> None:
    schema["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A `read` token for GET, an `admin` token for everything else "
            "(DYGO_READ_TOKEN / DYGO_ADMIN_TOKEN). Not needed in development on localhost "
            "when no token is configured.",
        }
    }
    for path, operations in schema["paths"].items():
        if path.startswith(PROTECTED_PREFIX) and not signed(path):
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]
