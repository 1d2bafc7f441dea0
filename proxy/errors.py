"""Every error radixgate answers with, and how each frontend spells it.

    RadixgateError                      (500 / INTERNAL)
    ├── BadRequest                      (400 / INVALID_ARGUMENT)   malformed JSON, wrong types, no prompt
    │   ├── PayloadTooLarge             (413 / INVALID_ARGUMENT)   body or prompt over the limit
    │   └── UnsupportedEncoding         (415 / INVALID_ARGUMENT)   a compressed request body
    ├── Unauthorized                    (401 / UNAUTHENTICATED)    missing or wrong API key
    ├── Forbidden                       (403 / PERMISSION_DENIED)  an operator's endpoint on a port without keys
    ├── ModelNotFound                   (404 / NOT_FOUND)          no worker serves the model
    ├── ResponseNotFound                (404 / NOT_FOUND)          no worker holds that stored response
    ├── Overloaded                      (429 / RESOURCE_EXHAUSTED) admission queue full / wait timed out / rate limit
    ├── NoHealthyWorker                 (503 / UNAVAILABLE)        every worker down or ejected
    ├── ShuttingDown                    (503 / UNAVAILABLE)        draining after SIGTERM
    ├── UpstreamError                   (502 / UNAVAILABLE)        worker connect error, 5xx, died mid-stream
    └── UpstreamTimeout                 (504 / DEADLINE_EXCEEDED)  worker or deadline timed out

``cause`` is a short, bounded string used as a metric label (``errors_total{cause}``).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc


class RadixgateError(Exception):
    status: int = 500
    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    cause: str = "internal"
    # OpenAI-style error "type" for the JSON body.
    kind: str = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class BadRequest(RadixgateError):
    status, grpc_code, cause, kind = 400, grpc.StatusCode.INVALID_ARGUMENT, "bad_request", "invalid_request_error"


class PayloadTooLarge(BadRequest):
    status, cause = 413, "payload_too_large"


class UnsupportedEncoding(BadRequest):
    status, cause = 415, "unsupported_encoding"


class Unauthorized(RadixgateError):
    status, grpc_code, cause, kind = 401, grpc.StatusCode.UNAUTHENTICATED, "unauthorized", "authentication_error"


class Forbidden(RadixgateError):
    status, grpc_code, cause, kind = 403, grpc.StatusCode.PERMISSION_DENIED, "forbidden", "permission_error"


class ModelNotFound(RadixgateError):
    status, grpc_code, cause, kind = 404, grpc.StatusCode.NOT_FOUND, "model_not_found", "invalid_request_error"


class ResponseNotFound(RadixgateError):
    """A Responses id (GET /v1/responses/{id}, ``previous_response_id``) no worker of the fleet holds."""

    status, grpc_code, cause, kind = 404, grpc.StatusCode.NOT_FOUND, "response_not_found", "invalid_request_error"


class RouteNotFound(RadixgateError):
    """No such endpoint on this port (JSON, as the engines' own servers answer, not aiohttp's text)."""

    status, grpc_code, cause, kind = 404, grpc.StatusCode.UNIMPLEMENTED, "not_found", "invalid_request_error"


class MethodNotAllowed(RadixgateError):
    status, grpc_code, cause, kind = 405, grpc.StatusCode.UNIMPLEMENTED, "method_not_allowed", "invalid_request_error"


class Overloaded(RadixgateError):
    status, grpc_code, cause, kind = 429, grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded", "rate_limit_error"


class NoHealthyWorker(RadixgateError):
    status, grpc_code, cause, kind = 503, grpc.StatusCode.UNAVAILABLE, "no_healthy_worker", "service_unavailable"


class ShuttingDown(RadixgateError):
    status, grpc_code, cause, kind = 503, grpc.StatusCode.UNAVAILABLE, "shutting_down", "service_unavailable"


class UpstreamError(RadixgateError):
    status, grpc_code, cause, kind = 502, grpc.StatusCode.UNAVAILABLE, "upstream_error", "upstream_error"


class UpstreamTimeout(RadixgateError):
    status, grpc_code, cause, kind = 504, grpc.StatusCode.DEADLINE_EXCEEDED, "upstream_timeout", "timeout"


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """The caller's dialect: SGLang native and OpenAI share {"error": {...}}; OpenAI adds type/code;
    Anthropic's is {"type": "error", "error": {"type", "message"}}."""

    status: int
    payload: dict[str, object]


# Anthropic's error types by status (its SDK maps them to exception classes).
_ANTHROPIC_KIND = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                   429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_kind(status: int) -> str:
    return _ANTHROPIC_KIND.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def to_body(err: RadixgateError, *, dialect: str) -> ErrorBody:
    if dialect == "anthropic":
        return ErrorBody(err.status, {"type": "error", "error": {"type": anthropic_kind(err.status),
                                                                 "message": err.message}})
    inner: dict[str, object] = {"message": err.message}
    if dialect == "openai":
        inner.update({"type": err.kind, "code": err.status, "param": None})
    else:
        inner.update({"type": err.kind, "code": err.status})
    return ErrorBody(err.status, {"error": inner})


def from_upstream_status(status: int | None, message: str) -> RadixgateError:
    """A worker's HTTP error status → the error radixgate reports (frontends that re-encode, e.g. gRPC)."""
    by_status: dict[int, type[RadixgateError]] = {
        400: BadRequest, 413: PayloadTooLarge, 422: BadRequest, 404: ModelNotFound, 429: Overloaded,
        503: Overloaded, 504: UpstreamTimeout, 408: UpstreamTimeout,
    }
    if status is not None and status in by_status:
        return by_status[status](message)
    if status is not None and 400 <= status < 500:
        return BadRequest(message)
    return UpstreamError(message)
