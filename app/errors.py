"""The one error shape of the API, `{"error": {"code", "message", "details"}}`, and its OpenAPI docs."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        self.status, self.code, self.message, self.details, self.headers = status, code, message, details, headers
        super().__init__(message)


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


class ErrorDetail(BaseModel):
    code: str = Field(description="Machine-readable, e.g. 'invalid_transition'")
    message: str = Field(description="What went wrong, for a person")
    details: Any = Field(None, description="Structured context: invalid fields, the job's current state, ...")


class ErrorResponse(BaseModel):
    error: ErrorDetail


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error statuses."""
    meaning = {
        400: "Malformed JSON or cursor (invalid_json, invalid_cursor)",
        401: "Missing or unknown bearer token (unauthorized)",
        403: "Read-only token on a write, or an operation refused in this environment",
        404: "No such job or queue (job_not_found, queue_not_found)",
        409: "The job's state does not allow this (invalid_transition, idempotency_conflict), or the "
        "Idempotency-Key header and body differ (idempotency_key_mismatch)",
        413: "Request body larger than max_payload_bytes (payload_too_large)",
        422: "Invalid input (invalid_request, unknown_kind, unknown_queue, invalid_args, invalid_option, "
        "invalid_duration, invalid_timestamp, batch_too_large, invalid_value)",
        503: "Database unreachable or schema not migrated (database_unavailable, not_ready)",
    }
    return {status: {"model": ErrorResponse, "description": meaning[status]} for status in statuses}
