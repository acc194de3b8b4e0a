"""The one error shape of the API, `{"error": {"code", "message", "details"}}`, and its OpenAPI docs.

Every error a request is refused with on purpose is a `CodedError` (store/errors.py), which carries its
HTTP status: the store's (EnqueueError, NotFound, Conflict, DatabaseUnavailable) and the API's own
(`ApiError`, whose status is given where it is raised). One handler answers them all (`coded_response`).
"""

from __future__ import annotations

from typing import Any

from dygo.store.errors import CodedError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


class ApiError(CodedError):
    """A refusal of the API itself (a bad cursor, an unknown kind, a header that contradicts the body)."""

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(code, message, details, http_status=status, headers=headers)

    @property
    def status(self) -> int:
        return self.http_status


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def coded_response(exc: CodedError) -> JSONResponse:
    """The API's answer to `exc`: its status, its headers, and the error body."""
    return error_response(exc.http_status, exc.code, exc.message, exc.details, exc.headers)


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
        422: "Invalid input (invalid_request, invalid_kind, unknown_kind, unknown_queue, invalid_args, "
        "invalid_option, invalid_duration, invalid_timestamp, batch_too_large, invalid_value)",
        503: "Database unreachable or schema not migrated (database_unavailable, not_ready)",
    }
    return {status: {"model": ErrorResponse, "description": meaning[status]} for status in statuses}
